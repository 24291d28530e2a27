"""Why a timed kernel is far from the hardware's limit, and what to change, without a GPU.

Every reason is a pure function of recorded figures (:class:`LaunchFacts`), so each is
tested here with the figures of real devices written into the tests: an H200 (sm_90,
132 SMs, a device-to-device copy measured at 4.0 to 4.3 TB/s, DRAM peak 4.8 TB/s, 60 MB
of L2) and a T4 (sm_75, 40 SMs, 320 GB/s).  The renderers are checked on reports built
from the same figures, and the quickstart's cells are checked for the code shape the
advice teaches.  The same reasons on a GPU, with kernels built to show each, are in
``tests/test_gpu_efficiency.py``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import hardware
from pnex_magic.efficiency import (
    FAR, TUNE_SHAPE, UNEXPLAINED, Efficiency, LaunchFacts, Reason, input_bytes, reasons, strided_along_x,
)
from pnex_magic.launch import autotune
from pnex_magic.render.tuning import autotune_html, efficiency_html, tune_names

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- recorded figures

#: An NVIDIA H200: sm_90, 132 SMs, 2,048 threads per SM; its device-to-device copy measured
#: 4.0 to 4.3 TB/s (read + written bytes per second), DRAM peak 4.8 TB/s, 60 MB of L2.
H200 = dict(arch="sm_90", sm_count=132, ceiling_bandwidth=4.0e12)
H200_PEAK, H200_L2 = 4.8e12, 60 << 20
#: An NVIDIA T4: sm_75, 40 SMs, 1,024 threads per SM, 320 GB/s.
T4 = dict(arch="sm_75", sm_count=40, ceiling_bandwidth=320e9)


def copy_facts(n: int, bandwidth: float, *, items: int = 1, block: int = 256, device=H200, registers: int = 16,
               **change) -> LaunchFacts:
    """A float32 copy of ``n`` elements, ``items`` per thread, that ran at ``bandwidth``
    (read + written bytes per second)."""
    threads = -(-n // items)
    moved = 8 * n
    facts = LaunchFacts(
        registers=registers, shared_bytes=0, spill_store_bytes=0, spill_load_bytes=0, block=(block, 1, 1),
        grid=(-(-threads // block), 1, 1), op_seconds=moved / bandwidth, bytes_moved=moved, x_extent=threads,
        input_bytes=4 * n, **device,
    )
    return dataclasses.replace(facts, **change)


def efficiency(op_bandwidth: float, found: tuple[Reason, ...] = (), **kwargs) -> Efficiency:
    """The H200's ceilings, unless given."""
    return Efficiency(
        op_bandwidth=op_bandwidth, eager_bandwidth=kwargs.pop("eager", 4.37e12),
        copy_bandwidth=kwargs.pop("copy", 4.0e12), peak_bandwidth=kwargs.pop("peak", H200_PEAK), peak_source="test",
        device=kwargs.pop("device", "NVIDIA H200"), bytes_moved=kwargs.pop("moved", 1 << 30), reasons=found, **kwargs,
    )


def kinds(found) -> list[str]:
    return [r.kind for r in found]


# --------------------------------------------------------------------------- the device's figures


def test_dram_latency_table_has_a_source_for_each_architecture():
    for cc, (seconds, source) in hardware.DRAM_LATENCY.items():
        assert 200e-9 < seconds < 500e-9, cc  # idle pointer-chasing latencies: a few hundred ns
        assert "cycles" in source
    assert hardware.dram_latency("sm_90")[0] == pytest.approx(348e-9, rel=0.01)  # GH200: 689 cycles at 1980 MHz
    assert hardware.dram_latency("sm_80")[0] == pytest.approx(391e-9, rel=0.01)  # A100: 552 cycles at 1410 MHz
    assert hardware.dram_latency("sm_87") == hardware.dram_latency("sm_80")  # another minor: the major's figure
    assert "Volta" in hardware.dram_latency("sm_75")[1]  # no Turing measurement: said so
    assert hardware.dram_latency("sm_60") is None


def test_resident_blocks_and_threads_per_sm():
    assert hardware.resident_blocks("sm_90", 16, 0, 256) == 8  # 2,048 threads per SM
    assert hardware.resident_blocks("sm_90", 96, 0, 256) == 2  # registers: 96 × 256 of 65,536
    assert hardware.resident_blocks("sm_75", 16, 0, 256) == 4  # 1,024 threads per SM
    assert hardware.resident_blocks("sm_90", 16, 300_000, 256) == 0
    assert hardware.max_threads_per_sm("sm_90") == 2048 and hardware.max_threads_per_sm("sm_75") == 1024


# --------------------------------------------------------------------------- each reason

FACTS = LaunchFacts(
    arch="sm_90", registers=32, shared_bytes=0, spill_store_bytes=0, spill_load_bytes=0, block=(256, 1, 1),
    grid=(4096, 1, 1), sm_count=132, op_seconds=1e-3, bytes_moved=1 << 30, x_extent=1 << 20,
)


@pytest.mark.parametrize(
    "change, kind, expected",
    [
        (dict(op_seconds=3e-6), "launch", "launch overhead dominates: a call takes 3 µs for 1.07 GB"),
        (dict(grid=(16, 1, 1)), "blocks", "too few blocks to fill the GPU: 16 block(s) of 256 threads for 132 SMs"),
        (dict(spill_store_bytes=64, spill_load_bytes=32), "spills",
         "register spills: 64 B stored and 32 B loaded per thread"),
        (dict(registers=96), "occupancy", "occupancy 25% limited by registers (96 per thread × 256 threads per block)"),
        (dict(shared_bytes=100_000), "occupancy", "occupancy 25% limited by shared memory (100,000 B per block)"),
        (dict(arch="sm_86", block=(32, 1, 1)), "occupancy", "occupancy 33% limited by the SM's block slots"),
        (dict(strided=(("a", 4096),)), "uncoalesced",
         "uncoalesced loads: 'a' (stride 4096) not contiguous along the axis"),
        (dict(block=(4, 64, 1)), "narrow", "blocks narrower than a warp: X size 4, so each warp's loads span 8 rows"),
        (dict(grid=(1373, 1, 1)), "wave", "a partial last wave: 1,373 blocks are 1.30 waves of 1,056"),
    ],
)
def test_each_reason_from_synthetic_facts(change, kind, expected):
    found = reasons(dataclasses.replace(FACTS, **change))
    assert kinds(found) == [kind] and found[0].finding.startswith(expected), found
    assert str(found[0]) == f"{found[0].finding}; {found[0].advice}"


def test_reasons_come_most_likely_first_and_none_for_a_healthy_launch():
    assert reasons(FACTS) == ()
    assert reasons(dataclasses.replace(FACTS, block=(4, 64, 1), x_extent=4)) == ()  # x fits in the block
    many = reasons(dataclasses.replace(FACTS, op_seconds=2e-6, grid=(2, 1, 1), registers=96, strided=(("b", 2),),
                                       spill_store_bytes=8))
    assert kinds(many) == ["launch", "blocks", "uncoalesced", "occupancy", "spills"]


def test_quickstart_copy_on_an_h200_has_too_few_bytes_in_flight():
    """The quickstart's one-element-per-thread copy: 4 Mi float32 (33.6 MB moved) at 2.72 TB/s,
    68% of the 4.0 TB/s copy: each thread has one 4-byte load outstanding."""
    facts = copy_facts(1 << 22, 2.72e12)
    assert facts.bytes_moved == 33_554_432 and facts.op_seconds == pytest.approx(12.3e-6, rel=0.01)
    found = reasons(facts)
    assert kinds(found) == ["in flight"]
    why = found[0]
    # 2,048 resident threads × 4 B = 8.19 kB; 4 TB/s × 348 ns / 132 SMs = 10.5 kB
    assert why.finding.startswith("too few bytes in flight: each SM keeps about 8.19 kB of loads in flight "
                                  "(2,048 resident threads × 4 B read per thread)")
    assert "4 TB/s × 348 ns DRAM latency / 132 SMs needs about 10.5 kB (Little's law)" in why.finding
    assert "at most about 78% of the ceiling" in why.finding
    assert "pnex.Tune" in why.advice and "block-strided (j = base + k * cuda.blockDim.x)" in why.advice
    assert "load them all before storing" in why.advice and "never j = i * ITEMS + k" in why.advice
    assert why.code == TUNE_SHAPE
    e = efficiency(2.72e12, found, moved=facts.bytes_moved, l2_bytes=H200_L2)
    assert e.op_of_copy == pytest.approx(0.68) and e.far and e.explanation is why
    text = "\n".join(e.lines())
    assert "why       : below 85% of the ceiling: too few bytes in flight" in text
    assert "change    : give each thread several independent elements with pnex.Tune" in text
    assert "            for k in range(ITEMS):" in text  # the code shape, indented under the advice


def test_the_tune_version_keeps_enough_in_flight():
    # block-strided, 4 elements per thread: 16 B in flight per thread, 32.8 kB per SM
    assert reasons(copy_facts(1 << 22, 3.6e12, items=4)) == ()
    assert reasons(copy_facts(1 << 28, 3.6e12, items=8)) == ()  # 256 Mi elements
    # two elements per thread: 16.4 kB per SM, above the 10.5 kB needed
    assert "in flight" not in kinds(reasons(copy_facts(1 << 24, 3.0e12, items=2)))


def test_the_advice_names_the_tune_choice_the_call_ran_with():
    # 50% occupancy (64 registers per thread) and two elements per thread: 8.19 kB per SM
    found = reasons(copy_facts(1 << 24, 2.6e12, items=2, registers=64, tune=(("ITEMS", 2),)))
    assert kinds(found)[0] == "in flight"
    assert found[0].advice.startswith("it ran with ITEMS=2: offer more elements per thread among the Tune choices, "
                                      "block-strided")


def test_a_t4_needs_fewer_bytes_in_flight_than_an_h200():
    """320 GB/s × 314 ns / 40 SMs = 2.5 kB per SM: one 4-byte element per thread, 1,024
    threads per SM, is enough; at 25% occupancy (255 registers per thread) it is not."""
    assert reasons(copy_facts(1 << 22, 250e9, device=T4)) == ()
    found = reasons(copy_facts(1 << 22, 120e9, device=T4, registers=255))
    assert kinds(found) == ["in flight", "occupancy"]
    assert "256 resident threads × 4 B" in found[0].finding
    assert "320 GB/s × 314 ns DRAM latency / 40 SMs needs about 2.52 kB" in found[0].finding
    assert found[1].finding.startswith("occupancy 25% limited by registers (255 per thread")


def test_a_call_too_small_for_the_gpu_whatever_the_kernel():
    # 256 Ki elements: the grid gives each SM 1,986 threads, 7.94 kB: the whole call is in flight at
    # once, and more elements per thread would not add any (so no Tune advice)
    found = reasons(copy_facts(1 << 18, 0.2e12))
    assert kinds(found) == ["in flight"]
    assert "the whole call reads about 7.94 kB per SM" in found[0].finding and found[0].code == ""
    assert "give each call more work" in found[0].advice
    # tinier still: launch overhead and 64 blocks for 132 SMs; the in-flight line would only repeat them
    assert kinds(reasons(copy_facts(1 << 14, 0.05e12))) == ["launch", "blocks"]


def test_a_partial_last_wave_matters_only_when_its_blocks_starve():
    # 1.30 waves of 1,056 blocks (8 × 132), 8 B in flight per thread: the last wave's 30% of the
    # blocks keep 0.3 × 16.4 kB, below the 10.5 kB needed: about 35% of the SMs' time is idle.
    # (A kernel that works 20 µs per call: a copy of this size would be launch-bound.)
    facts = copy_facts(2 * 1373 * 256, 3.0e12, items=2, op_seconds=20e-6)
    assert facts.grid == (1373, 1, 1)
    found = reasons(facts)
    assert kinds(found) == ["wave"]
    assert found[0].finding == ("a partial last wave: 1,373 blocks are 1.30 waves of 1,056 (8 resident blocks of "
                                "256 threads per SM × 132 SMs), so the last wave runs 30% full and about 35% of "
                                "the SMs' time is idle")
    assert "pnex.Tune" in found[0].advice and "threads_per_block='auto'" in found[0].advice
    # a memory-bound kernel with 32 B per thread: the tail's blocks alone keep enough in flight
    assert reasons(copy_facts(8 * 1373 * 256, 2.8e12, items=8)) == ()
    assert reasons(copy_facts(2 * 16000 * 256, 3.6e12, items=2)) == ()  # 15.2 waves: the tail hardly counts


def test_nothing_is_said_at_85_percent_of_the_ceiling_or_more():
    found = reasons(copy_facts(1 << 22, 2.72e12))
    assert FAR == 0.85
    for bandwidth in (3.4e12, 3.6e12, 4.37e12):
        e = efficiency(bandwidth, found)
        assert not e.far and e.explanation is None and e.reason is None and e.also == ()
        assert "why" not in "\n".join(e.lines())
        assert "why below" not in efficiency_html(e, "copy", "torch.clone")
    assert efficiency(3.39e12, found).far


def test_efficiency_fractions_and_the_unexplained_line():
    e = efficiency(3.6e12)
    assert e.op_of_copy == pytest.approx(0.9) and e.op_of_peak == pytest.approx(0.75) and not e.far
    assert efficiency(3.0e12).explanation is UNEXPLAINED
    assert "may be compute-bound" in efficiency(3.0e12).reason
    assert "1 TB/s = 25% of the device-to-device copy, 21% of peak" in "\n".join(efficiency(1e12).lines())
    assert efficiency(3e12, l2_bytes=2 << 30).in_l2 and not e.in_l2


# --------------------------------------------------------------------------- facts from a call


def test_input_bytes_and_strided_inputs_along_the_x_axis():
    def scale(a: pnex.In("f32", (None, None)), s: int, out: pnex.Out("f32", "a")):
        x, y = cuda.grid(2)
        if y < out.shape[0] and x < out.shape[1]:
            out[y, x] = a[y, x] * s

    spec = pnex.jit(n_threads=("out.size(1)", "out.size(0)"))(scale).spec  # x: the last axis
    a = torch.empty(8, 6)
    assert strided_along_x(spec, (a, 2)) == () and input_bytes(spec, (a, 2)) == 8 * 6 * 4
    assert strided_along_x(spec, (a.t(), 2)) == (("a", 6),)

    def bump(x: pnex.InMut("f64", (None,)), y: pnex.In("i8", "x"), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] + y[i]

    spec1 = pnex.jit(n_threads="x.numel()")(bump).spec
    x = torch.empty(16, dtype=torch.float64)
    assert input_bytes(spec1, (x, torch.empty(16, dtype=torch.int8))) == 16 * 8 + 16  # In and InMut, not Out
    assert strided_along_x(spec1, (x[::2], torch.empty(8, dtype=torch.int8))) == (("x", 2),)


# --------------------------------------------------------------------------- rendering


def test_html_names_the_reason_the_fix_and_the_code():
    found = reasons(copy_facts(1 << 22, 120e9, device=T4, registers=255))
    assert kinds(found) == ["in flight", "occupancy"]
    e = efficiency(120e9, found, eager=250e9, copy=320e9, peak=320e9, device="Tesla T4", dram_latency=314e-9,
                   latency_source="V100: 434 cycles at 1380 MHz")
    html = efficiency_html(e, "copy", "torch.clone")
    assert "<b>why below 85% of the ceiling</b>: too few bytes in flight: each SM keeps about 1.02 kB" in html
    assert "<b>what to change</b>: give each thread several independent elements with pnex.Tune" in html
    assert "<pre" in html and "cuda.local.array" in html and "ITEMS" in html  # the code shape, highlighted
    assert "also:<ul" in html and "<li>occupancy 25% limited by registers" in html
    assert "DRAM latency 314 ns, idle, from V100: 434 cycles at 1380 MHz" in html
    assert "width:37.5%" in html  # the op's bar, against the largest figure: the copy
    assert "j = i * ITEMS + k" in html  # named only as the form to avoid
    text_code = TUNE_SHAPE.split("\n")
    assert any("base + k * cuda.blockDim.x" in line for line in text_code)
    assert not any(re.search(r"=\s*\w+ \* ITEMS \+ k", line) and not line.startswith("#") for line in text_code)


def _tune_result(seconds_total=1.42) -> autotune.TuneResult:
    rows = []
    for block in (256, 128):
        for items in (1, 2, 4, 8):
            rows.append(autotune.CandidateResult((block,), 10e-6 / min(items, 4) + block * 1e-9,
                                                 tune=(("ITEMS", items),)))
    rows[7] = autotune.CandidateResult((128,), skipped="results differ from the first candidate's",
                                       tune=(("ITEMS", 8),))
    return autotune.TuneResult("copy_tuned", (1 << 24,), "a.numel()=16777216 (sizes rounded up to powers of two), "
                               "contiguous inputs", tuple(rows), 6, "benchmarked", "NVIDIA H200",
                               seconds_total=seconds_total)


def test_candidate_table_lists_blocks_by_tune_values_and_the_tuning_time():
    result = _tune_result()
    assert tune_names(result.candidates) == ("ITEMS",)
    assert result.candidates[6].label() == "128, ITEMS=4"

    def copy_tuned(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            result[i] = a[i]

    op = pnex.jit(n_threads="a.numel()")(copy_tuned)  # a fixed block: the table shows for the Tune values alone
    base = pnex.build_report(op, args=(torch.zeros(5),), sass=False)
    kernel = dataclasses.replace(base, autotune=result)
    html = autotune_html(kernel)
    assert "8 candidates: 2 block shapes × ITEMS in (1, 2, 4, 8)" in html
    assert "chose <code" in html and "128, ITEMS=4</code> (benchmarked" in html
    assert ">ITEMS</code></th>" in html and "results differ from the first candidate" in html
    assert "tuning took 1.42 s for this key (8 candidates, compiles included)" in html
    assert "tuning took" not in autotune_html(dataclasses.replace(kernel, autotune=_tune_result(None)))

    from pnex_magic.render.report import PnexReport

    report = PnexReport.from_kernel(kernel, op, "copy_tuned")
    assert "8 candidates: 2 block shapes" in report.launch_html()
    assert "autotuned: 128, ITEMS=4" in report.header_html()
    plain = PnexReport.from_kernel(base, op, "copy_tuned")
    assert "autotune" not in plain.launch_html()  # a fixed block, no Tune: no table


def test_report_renders_timed_candidates_the_bars_and_the_reason():
    from pnex_magic.render.report import PnexReport
    from pnex_magic.timing import Measurement, TimingResult

    def scale_kernel(a: pnex.In("f32", (None, None)), s: int, out: pnex.Out("f32", "a")):
        x, y = cuda.grid(2)
        if y < out.shape[0] and x < out.shape[1]:
            out[y, x] = a[y, x] * s

    op = pnex.jit(n_threads=("out.size(1)", "out.size(0)"), threads_per_block=[(16, 16), (4, 64), (32, 8)])(
        scale_kernel)
    base = pnex.build_report(op, args=(torch.zeros(3, 5), 2), sass=False)
    result = autotune.TuneResult(
        "scale_kernel", (1 << 20, 4), "a.size(0)=1048576, a.size(1)=4 (sizes rounded up to powers of two), "
        "contiguous inputs",
        (autotune.CandidateResult((16, 16), 40e-6), autotune.CandidateResult((4, 64), 10e-6),
         autotune.CandidateResult((32, 8), skipped="needs 131,072 blocks on axis Y for this call")),
        1, "benchmarked", "Fake GPU",
    )
    timing = TimingResult(Measurement(10, 3, (1e-3,) * 3), Measurement(10, 3, (4e-3,) * 3), None, 32 << 20, "cuda:0")
    narrow = reasons(dataclasses.replace(FACTS, block=(4, 64, 1)))
    e = dataclasses.replace(efficiency(timing.bandwidth, narrow, eager=timing.eager_bandwidth), device="Fake GPU")
    kernel = dataclasses.replace(base, autotune=result, timing=timing, efficiency=e, block=(4, 64, 1))
    report = PnexReport.from_kernel(kernel, op, "scale_k")
    launch = report.launch_html()
    assert "chose <code" in launch and "4.00×" in launch and "needs 131,072 blocks on axis Y" in launch
    assert "256 threads per block (4 × 64)" in launch and "tuning took" not in launch
    assert "autotuned: (4, 64)" in report.header_html()
    text = report.to_text()
    assert "autotune  : (4, 64) (benchmarked, 4.00x the first candidate's speed)" in text
    assert "* (4, 64)" in text and "skipped: needs 131,072 blocks" in text
    assert "ceiling   : copy 4 TB/s (measured), peak 4.8 TB/s on Fake GPU" in text
    assert "why       : below 85% of the ceiling: blocks narrower than a warp: X size 4" in text
    assert "change    : use a block with X ≥ 32" in text
    timing_html = report.timing_html()
    assert "bandwidth against the device's limits" in timing_html and "DRAM peak" in timing_html
    assert "why below 85% of the ceiling</b>: blocks narrower than a warp" in timing_html


def test_widget_view_shows_the_reason(monkeypatch):
    pytest.importorskip("ipywidgets")
    from pnex_magic.render.report import PnexReport
    from pnex_magic.timing import Measurement, TimingResult

    def copy_w(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            result[i] = a[i]

    op = pnex.jit(n_threads="a.numel()")(copy_w)
    base = pnex.build_report(op, args=(torch.zeros(5),), sass=False)
    # 10 loops per run: 12.3 µs per call (2.73 TB/s), torch.clone 7.7 µs
    timing = TimingResult(Measurement(10, 3, (123e-6,) * 3), Measurement(10, 3, (77e-6,) * 3), None, 33_554_432,
                          "cuda:0")
    e = efficiency(timing.bandwidth, reasons(copy_facts(1 << 22, 2.72e12)), eager=timing.eager_bandwidth)
    report = PnexReport.from_kernel(dataclasses.replace(base, timing=timing, efficiency=e), op, "copy_w")
    widget = report.widget()
    timing_tab = widget.children[1].children[-1].value
    assert "why below 85% of the ceiling" in timing_tab and "too few bytes in flight" in timing_tab


# --------------------------------------------------------------------------- the quickstart


def _quickstart_cells() -> list[str]:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(ROOT / "notebooks" / "01_quickstart.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_quickstart_leads_with_a_fused_kernel_then_the_copy_from_naive_to_tune():
    cells = _quickstart_cells()
    magics = [c for c in cells if c.startswith("%%pnex")]
    assert "--eager lambda a, b, c: a * torch.sigmoid(b) + c" in magics[0].splitlines()[0]
    assert "FULL" not in cells[0] and "N = 1 << 24 if device == \"cuda\" else 32" in cells[0]  # the size switch
    naive = next(i for i, c in enumerate(magics) if c.startswith("%%pnex --n-threads a.numel() --args (A,)"))
    tuned = next(i for i, c in enumerate(magics) if "Tune(" in c)
    assert 0 < naive < tuned
    line, body = magics[tuned].split("\n", 1)
    assert '--n-threads "(a.numel() + ITEMS - 1) // ITEMS"' in line and "--threads-per-block auto" in line
    assert "ITEMS: Tune(1, 2, 4, 8)" in body
    assert "base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x" in body
    assert "j = base + k * cuda.blockDim.x" in body and not re.search(r"\* ITEMS \+ k", body)
    # every load before the first store
    assert body.index("v[k] = a[j]") < body.index("result[j] = v[k]")


def _tuned_cell(items: int) -> tuple[str, str]:
    """The quickstart's Tune cell with one choice of ``ITEMS`` (``--tune``), which the
    simulator then runs."""
    cell = next(c for c in _quickstart_cells() if "Tune(" in c)
    line, body = cell.split("\n", 1)
    return line.removeprefix("%%pnex ") + f" --tune ITEMS={items}", body


@pytest.fixture(scope="module")
def ip():
    from IPython.testing import globalipapp

    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "pnex_magic")
    shell.run_cell("import math, torch\nfrom numba import float32")
    return shell


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("items", [1, 2, 4, 8])
def test_quickstart_tuned_copy_is_right_for_every_choice(ip, items):
    line, body = _tuned_cell(items)
    ip.run_cell("A = torch.arange(37, dtype=torch.float32)")  # 37: a partial last block
    ip.run_cell_magic("pnex", line + " -o rep_tuned", body)
    rep = ip.user_ns["rep_tuned"]
    assert rep.timing.correctness.ok and rep.kernel.n_threads_values == (math.ceil(37 / items),)
    html = rep.to_html()  # what the notebook shows
    assert "a compile-time constant the autotuner chooses" in html and f"ITEMS={items}" in html
    assert "ITEMS" in rep.to_text()


def test_quickstart_tuned_copy_issues_every_load_before_a_store(ip):
    """The compiled kernel (PTX for sm_90, no GPU needed) has ITEMS loads in flight per thread:
    the loop is unrolled, the items stay in registers, and no store comes between the loads."""
    line, body = _tuned_cell(4)
    ip.run_cell("A = torch.arange(37, dtype=torch.float32)")
    ip.run_cell_magic("pnex", line, body)
    op = ip.user_ns["copy_tuned"]
    if not op.definition.compiles:
        pytest.skip("no CUDA compiler wheels (pip install -e '.[cu13]')")
    k = pnex.inspect(op, arch="sm_90")
    memory = [m.group(1) for m in re.finditer(r"\b(ld|st)\.global\.f32", k.ptx)]
    assert memory == ["ld"] * 4 + ["st"] * 4
    assert k.local_bytes == 0 and not k.spills


def test_quickstart_fused_kernel_matches_eager_in_single_precision(ip):
    cells = _quickstart_cells()
    fused = next(c for c in cells if c.startswith("%%pnex"))
    line, body = fused.split("\n", 1)
    ip.run_cell("a1, b1, c1 = (torch.randn(40) for _ in range(3))")
    ip.run_cell_magic("pnex", line.removeprefix("%%pnex ") + " -o rep_fused", body)
    rep = ip.user_ns["rep_fused"]
    assert rep.timing.correctness.ok, rep.timing.correctness
    op = ip.user_ns["gated"]
    if op.definition.compiles:
        assert ".f64" not in pnex.inspect(op, arch="sm_90").ptx  # float32(1.0): no double-precision arithmetic
