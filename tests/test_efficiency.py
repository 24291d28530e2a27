"""Why a timed kernel is far from the hardware's limit, and what to change, without a GPU.

Every reason is a pure function of recorded figures (:class:`LaunchFacts`), so each is
tested here with the figures of real devices (:mod:`pnex_magic.profiles`: an H200 and an
H100 measured by this project, an A100, an L4 and a T4 from their spec sheets and
published measurements).  The renderers are checked on reports built from the same
figures, and the quickstart's cells are checked for the code shape the advice teaches.
``tests/test_gpu_profiles.py`` holds the model against published measurements and the
advice on each recorded GPU; the same reasons on a GPU, with kernels built to show each,
are in ``tests/test_gpu_efficiency.py``.
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
    FAR, TUNE_SHAPE, UNEXPLAINED, Efficiency, LaunchFacts, Reason, element_bytes, in_flight, input_bytes, reasons,
    strided_along_x,
)
from pnex_magic.launch import autotune
from pnex_magic.profiles import DeviceProfile, profile
from pnex_magic.render.tuning import autotune_html, efficiency_html, tune_names

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- recorded figures

H200 = profile("H200")  # sm_90, 132 SMs, 2,048 threads per SM, copy 3.83 TB/s, peak 4.8 TB/s, 60 MiB L2
T4 = profile("T4")  # sm_75, 40 SMs, 1,024 threads per SM, 320 GB/s (copy estimated at 288 GB/s)


def copy_facts(n: int, share: float, *, items: int = 1, block: int = 256, device: DeviceProfile = H200,
               registers: int = 16, **change) -> LaunchFacts:
    """A float32 copy of ``n`` elements, ``items`` per thread, that ran at ``share`` of the
    device's copy (read + written bytes per second)."""
    threads = -(-n // items)
    moved = 8 * n
    facts = LaunchFacts(
        arch=device.arch, registers=registers, shared_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
        block=(block, 1, 1), grid=(-(-threads // block), 1, 1), sm_count=device.sm_count,
        op_seconds=moved / (share * device.copy_bandwidth), bytes_moved=moved, x_extent=threads, input_bytes=4 * n,
        ceiling_bandwidth=device.copy_bandwidth, element_bytes=4,
    )
    return dataclasses.replace(facts, **change)


def efficiency(op_share: float, found: tuple[Reason, ...] = (), device: DeviceProfile = H200, **kwargs) -> Efficiency:
    """The device's ceilings, an op at ``op_share`` of its copy, torch.clone at the copy."""
    return Efficiency(
        op_bandwidth=op_share * device.copy_bandwidth, eager_bandwidth=kwargs.pop("eager", device.copy_bandwidth),
        copy_bandwidth=kwargs.pop("copy", device.copy_bandwidth),
        peak_bandwidth=kwargs.pop("peak", device.peak_bandwidth), peak_source="test",
        device=kwargs.pop("name", f"NVIDIA {device.name}"), bytes_moved=kwargs.pop("moved", 1 << 30), reasons=found,
        **kwargs,
    )


def kinds(found) -> list[str]:
    return [r.kind for r in found]


# --------------------------------------------------------------------------- the device's figures


def test_every_architecture_has_a_latency_under_load():
    for cc in hardware.SM_LIMITS:
        seconds = hardware.loaded_latency(f"sm_{cc[0]}{cc[1]}")
        assert 400e-9 < seconds < 1000e-9, cc  # about twice the idle pointer-chasing latencies
    assert hardware.loaded_latency("sm_90") == pytest.approx(730e-9)  # fitted to the H100's measured copies
    assert hardware.loaded_latency("sm_87") == hardware.loaded_latency("sm_80")  # another minor: the major's figure
    assert hardware.loaded_latency("sm_75") == hardware.loaded_latency("sm_70")  # Volta's stands in for Turing
    assert hardware.loaded_latency("sm_60") is None
    assert hardware.block_start("sm_90") == pytest.approx(81e-9) and hardware.block_start("sm_80") is None


def test_the_in_flight_curve_and_its_inverse():
    # Little's law at low load (the share is bytes / knee), the ceiling at high load
    assert hardware.in_flight_share(100, 10_000) == pytest.approx(0.01, rel=1e-4)
    assert hardware.in_flight_share(10_000, 10_000) == pytest.approx(2 ** (-1 / 3))  # 79% at the knee
    assert hardware.in_flight_share(1e9, 10_000) == pytest.approx(1.0)
    for share in (0.2, 0.5, 0.85, 0.95, 0.99):
        assert hardware.in_flight_share(hardware.in_flight_needed(7000, share), 7000) == pytest.approx(share)
    shares = [hardware.in_flight_share(b, 8192) for b in range(0, 100_000, 512)]
    assert shares == sorted(shares)  # more bytes in flight never lower the share


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
        (dict(op_seconds=3e-6), "launch", "launch overhead dominates: a call takes 3 µs for 1 GiB"),
        (dict(grid=(16, 1, 1)), "blocks", "too few blocks to fill the GPU: 16 block(s) of 256 threads for 132 SMs"),
        (dict(spill_store_bytes=64, spill_load_bytes=32), "spills",
         "register spills: 64 B stored and 32 B loaded per thread"),
        (dict(registers=96), "occupancy", "occupancy 25% limited by registers (96 per thread × 256 threads per block)"),
        (dict(shared_bytes=100_000), "occupancy", "occupancy 25% limited by shared memory (100,000 B per block)"),
        (dict(arch="sm_86", block=(32, 1, 1)), "occupancy", "occupancy 33% limited by the SM's block slots"),
        (dict(strided=(("a", 4096),)), "uncoalesced",
         "uncoalesced loads: 'a' (stride 4096) not contiguous along the axis"),
        (dict(block=(4, 64, 1)), "narrow",
         "blocks too narrow along x: X size 4, so a warp reads 16 B from each of 8 rows, while memory delivers "
         "whole 32-byte sectors"),
        (dict(block=(8, 32, 1), element_bytes=2), "narrow",
         "blocks too narrow along x: X size 8, so a warp reads 16 B"),
        (dict(grid=(1373, 1, 1)), "wave", "a partial last wave: 1,373 blocks are 1.30 waves of 1,056"),
        (dict(block=(64, 1, 1), grid=(4_194_304, 1, 1), op_seconds=2.54e-3), "block rate",
         "blocks of little work: 4,194,304 blocks of 64 threads, 256 B each, in 2.54 ms: each SM starts one every "
         "80 ns, about as fast as an SM of this GPU can (one every 81 ns)"),
    ],
)
def test_each_reason_from_synthetic_facts(change, kind, expected):
    found = reasons(dataclasses.replace(FACTS, **change))
    assert kinds(found) == [kind] and found[0].finding.startswith(expected), found
    assert str(found[0]) == f"{found[0].finding}; {found[0].advice}"


def test_reasons_come_most_likely_first_and_none_for_a_healthy_launch():
    assert reasons(FACTS) == ()
    assert reasons(dataclasses.replace(FACTS, block=(4, 64, 1), x_extent=4)) == ()  # x fits in the block
    # X of 16 float32 or 8 float64: a warp reads 64 B of each row, whole sectors: not narrow
    assert reasons(dataclasses.replace(FACTS, block=(16, 16, 1))) == ()
    assert reasons(dataclasses.replace(FACTS, block=(4, 64, 1), element_bytes=8)) == ()
    many = reasons(dataclasses.replace(FACTS, op_seconds=2e-6, grid=(2, 1, 1), registers=96, strided=(("b", 2),),
                                       spill_store_bytes=8))
    assert kinds(many) == ["launch", "blocks", "uncoalesced", "occupancy", "spills"]
    # no block start figure for sm_80: small blocks are not named there
    assert "block rate" not in kinds(reasons(dataclasses.replace(FACTS, arch="sm_80", block=(64, 1, 1),
                                                                 grid=(4_194_304, 1, 1), op_seconds=2.54e-3)))


def test_quickstart_copy_on_an_h200_has_too_few_bytes_in_flight():
    """The quickstart's one-element-per-thread copy: 16 Mi float32 (128 MiB moved) at 0.655 of
    the H200's copy (measured): each thread has one 4-byte load outstanding."""
    facts = copy_facts(1 << 24, 0.655)
    assert facts.bytes_moved == 134_217_728
    found = reasons(facts)
    assert kinds(found) == ["in flight"]
    why = found[0]
    flight = in_flight(facts)
    # 2,048 resident threads × 4 B = 8 KiB; 3.83 TB/s / 2 (half the bytes are read) / 132 SMs × 730 ns = 10.3 KiB
    assert flight.have == 8192 and flight.knee == pytest.approx(3.83e12 / 2 / 132 * 730e-9)
    assert why.finding == ("too few bytes in flight: each SM keeps about 8 KiB of loads in flight (2,048 resident "
                           "threads × 4 B read per thread), enough for about 68% of the ceiling on this GPU, where "
                           "about 18.8 KiB per SM would reach 95%")
    assert why.headline == "too few bytes in flight"
    assert "pnex.Tune" in why.advice and "block-strided (j = base + k * cuda.blockDim.x)" in why.advice
    assert "load them all before storing" in why.advice and "never j = i * ITEMS + k" in why.advice
    assert why.code == TUNE_SHAPE
    e = efficiency(0.655, found, moved=facts.bytes_moved, l2_bytes=H200.l2_bytes)
    assert e.op_of_copy == pytest.approx(0.655) and e.far and e.explanation is why
    text = "\n".join(e.lines())
    assert "why       : below 85% of the ceiling: too few bytes in flight" in text
    assert "change    : give each thread several independent elements with pnex.Tune" in text
    assert "            for k in range(ITEMS):" in text  # the code shape, indented under the advice
    # the wording stays plain: no latency, no sources, no law
    assert not re.search(r"latency|Little|GH200|RRZE|gpu-benches|asks for", text + str(why))


def test_the_tune_version_keeps_enough_in_flight():
    # block-strided, 4 elements per thread: 16 B in flight per thread, 32.8 kB per SM
    assert reasons(copy_facts(1 << 24, 0.99, items=4)) == ()
    assert reasons(copy_facts(1 << 28, 0.99, items=8)) == ()  # 256 Mi elements
    # two elements per thread: 16.4 kB per SM allow 92%; at 0.89 (measured) nothing below 85% to explain
    assert in_flight(copy_facts(1 << 24, 0.89, items=2)).share == pytest.approx(0.92, abs=0.01)
    assert not efficiency(0.89).far


def test_the_advice_names_the_tune_choice_the_call_ran_with():
    # 50% occupancy (64 registers per thread) and two elements per thread: 8.19 kB per SM
    found = reasons(copy_facts(1 << 24, 0.66, items=2, registers=64, tune=(("ITEMS", 2),)))
    assert kinds(found)[0] == "in flight"
    assert found[0].advice.startswith("it ran with ITEMS=2: offer more elements per thread among the Tune choices, "
                                      "block-strided")


def test_bytes_in_flight_are_not_blamed_where_they_allow_the_ceiling():
    """A T4 keeps 4.1 kB per SM with one element per thread, 1,024 threads: enough for 92%.
    A copy at 60% there is not blamed on its bytes in flight (something else binds); at 25%
    occupancy (255 registers per thread) they do limit it."""
    assert in_flight(copy_facts(1 << 22, 0.6, device=T4)).share == pytest.approx(0.92, abs=0.01)
    assert reasons(copy_facts(1 << 22, 0.6, device=T4)) == ()
    assert efficiency(0.6, device=T4).explanation is UNEXPLAINED
    found = reasons(copy_facts(1 << 22, 0.4, device=T4, registers=255))
    assert kinds(found) == ["in flight", "occupancy"]
    assert "256 resident threads × 4 B" in found[0].finding
    assert "enough for about 38% of the ceiling" in found[0].finding
    assert found[1].finding.startswith("occupancy 25% limited by registers (255 per thread")


def test_a_call_too_small_for_the_gpu_whatever_the_kernel():
    # 256 Ki elements: the grid gives each SM 1,986 threads, 7.76 KiB: the whole call is in flight at
    # once, and more elements per thread would not add any (so no Tune advice)
    found = reasons(copy_facts(1 << 18, 0.05))
    assert kinds(found) == ["in flight"]
    assert "the whole call reads about 7.76 KiB per SM" in found[0].finding and found[0].code == ""
    assert "give each call more work" in found[0].advice
    # tinier still: launch overhead and 64 blocks for 132 SMs; the in-flight line would only repeat them
    assert kinds(reasons(copy_facts(1 << 14, 0.0125))) == ["launch", "blocks"]


def test_a_partial_last_wave_matters_only_when_its_blocks_starve():
    # 1.30 waves of 1,056 blocks (8 × 132), 8 B in flight per thread: the last wave's 30% of the
    # blocks keep 0.3 × 16.4 kB per SM, which allows about 45% of the ceiling: about 35% of the SMs'
    # time is idle.  (A kernel that works 20 µs per call: a copy of this size would be launch-bound.)
    facts = copy_facts(2 * 1373 * 256, 0.8, items=2, op_seconds=20e-6)
    assert facts.grid == (1373, 1, 1)
    found = reasons(facts)
    assert kinds(found) == ["wave"]
    assert found[0].finding == ("a partial last wave: 1,373 blocks are 1.30 waves of 1,056 (8 resident blocks of "
                                "256 threads per SM × 132 SMs), so the last wave runs 30% full and about 35% of "
                                "the SMs' time is idle")
    assert "pnex.Tune" in found[0].advice and "threads_per_block='auto'" in found[0].advice
    # a memory-bound kernel with 32 B per thread: the tail's blocks alone keep enough in flight
    assert reasons(copy_facts(8 * 1373 * 256, 0.7, items=8)) == ()
    assert reasons(copy_facts(2 * 16000 * 256, 0.95, items=2)) == ()  # 15.2 waves: the tail hardly counts


def test_nothing_is_said_at_85_percent_of_the_ceiling_or_more():
    found = reasons(copy_facts(1 << 24, 0.655))
    assert FAR == 0.85
    for share in (0.85, 0.9, 1.05):
        e = efficiency(share, found)
        assert not e.far and e.explanation is None and e.reason is None and e.also == ()
        assert "why" not in "\n".join(e.lines())
        assert "why below" not in efficiency_html(e, "copy", "torch.clone")
    assert efficiency(0.849, found).far


def test_a_call_that_fits_in_l2_is_not_judged_against_dram():
    """The quickstart's mymuladd on an H100: 3 × 2048² float32 = 48 MiB per call, in a 50 MiB
    L2.  Its timed calls may be served from the cache: no verdict below 85%, no reasons, and the
    tab says plainly why."""
    narrow = reasons(dataclasses.replace(FACTS, block=(4, 64, 1)))
    e = efficiency(0.6, narrow, device=profile("H100 SXM"), moved=3 * 2048 * 2048 * 4, l2_bytes=52_428_800)
    assert e.in_l2 and not e.far and e.explanation is None and e.also == ()
    assert e.verdict.startswith("not judged: the call's 48 MiB fit in the GPU's 50 MiB L2, so back-to-back timed "
                                "calls may be served from the cache and the DRAM ceilings do not apply")
    html = efficiency_html(e, "mymuladd", "eager")
    assert "<b>not judged</b>: the call&#x27;s 48 MiB fit" in html and "why below" not in html
    assert "verdict   : not judged" in "\n".join(e.lines()) and "why" not in "\n".join(e.lines())
    past = dataclasses.replace(e, bytes_moved=4 * 3 * 2048 * 2048 * 4)  # 4096²: past L2, judged
    assert not past.in_l2 and past.far and past.explanation.kind == "narrow"


def test_a_tiny_call_in_l2_is_judged_launch_bound():
    """A 4 kB copy fits in any L2, but what keeps it from the ceiling is the launch, not DRAM:
    it is judged, and told so (the H100 run of tests/test_gpu_efficiency.py, 2026-11-25)."""
    facts = dataclasses.replace(FACTS, op_seconds=5e-6, bytes_moved=8192, input_bytes=4096)
    found = reasons(facts)
    assert kinds(found)[0] == "launch"
    e = efficiency(0.0005, found, moved=8192, l2_bytes=52_428_800)
    assert e.in_l2 and e.launch_bound and e.judged and e.far and e.explanation.kind == "launch"
    assert not e.verdict.startswith("not judged") and "verdict   : not judged" not in "\n".join(e.lines())
    assert "why below" in efficiency_html(e, "copy", "torch.clone")
    # the same bytes, not launch-bound (a slow kernel): in L2, not judged
    slow = efficiency(0.0005, (), moved=8192, l2_bytes=52_428_800)
    assert not slow.judged and not slow.far and slow.verdict.startswith("not judged")


def test_efficiency_fractions_and_the_unexplained_line():
    e = efficiency(0.9)
    assert e.op_of_copy == pytest.approx(0.9) and e.op_of_peak == pytest.approx(0.9 * 3.83 / 4.8) and not e.far
    assert efficiency(0.75).explanation is UNEXPLAINED
    # where the report's own figures explain nothing, one short line offers --profile
    assert efficiency(0.75).reason == ("no cause shows in the figures the report checks; run the cell again with "
                                       "--profile (in a script: pnex.profile(op, *args)) to measure what holds it back")
    assert "1.92 TB/s = 50% of the ceiling, 40% of peak" in "\n".join(efficiency(0.5).lines())
    assert efficiency(0.75, l2_bytes=2 << 30).in_l2 and not e.in_l2


def test_one_unit_for_every_rate_of_a_report():
    # an op under 1 TB/s beside a copy over it: both in TB/s
    e = efficiency(0.2, device=profile("H100 SXM"), eager=0.9e12)
    text = "\n".join(e.lines())
    assert "op        : 0.572 TB/s" in text and "eager     : 0.9 TB/s" in text and "GB/s" not in text
    t4 = efficiency(0.5, device=T4)  # everything under 1 TB/s: GB/s
    assert "TB/s" not in "\n".join(t4.lines()) and "144 GB/s" in "\n".join(t4.lines())


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
    assert element_bytes(spec, (a, 2)) == 4

    def bump(x: pnex.InMut("f64", (None,)), y: pnex.In("i8", "x"), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] + y[i]

    spec1 = pnex.jit(n_threads="x.numel()")(bump).spec
    x = torch.empty(16, dtype=torch.float64)
    assert input_bytes(spec1, (x, torch.empty(16, dtype=torch.int8))) == 16 * 8 + 16  # In and InMut, not Out
    assert element_bytes(spec1, (x, torch.empty(16, dtype=torch.int8))) == 1  # the smallest input element
    assert strided_along_x(spec1, (x[::2], torch.empty(8, dtype=torch.int8))) == (("x", 2),)


# --------------------------------------------------------------------------- rendering


def test_html_names_the_reason_the_fix_and_the_code():
    found = reasons(copy_facts(1 << 22, 0.4, device=T4, registers=255))
    assert kinds(found) == ["in flight", "occupancy"]
    e = efficiency(0.4, found, device=T4, eager=250e9)
    html = efficiency_html(e, "copy", "torch.clone")
    assert "<b>why below 85% of the ceiling</b>: too few bytes in flight: each SM keeps about 1 KiB" in html
    assert "<b>what to change</b>: give each thread several independent elements with pnex.Tune" in html
    assert "<pre" in html and "cuda.local.array" in html and "ITEMS" in html  # the code shape, highlighted
    assert "also:<ul" in html and "<li>occupancy 25% limited by registers" in html
    assert "width:36.0%" in html  # the op's bar (115 GB/s), against the largest figure: the peak (320 GB/s)
    # The bars keep a plain fill where a sanitiser drops var(): a plain declaration comes first.
    assert "background:#3b82c4;background:var(--jp-brand-color1, #3b82c4)" in html
    assert "j = i * ITEMS + k" in html  # named only as the form to avoid
    # The footnote is plain: what the ceiling and the peak are, no latency or sources.
    assert ("here 288 GB/s, the device-to-device copy. The memory: a device-to-device copy measured once per "
            "process") in html and "the peak: test" in html
    assert not re.search(r"latency|GH200|RRZE|Little|asks for", html)
    text_code = TUNE_SHAPE.split("\n")
    assert any("base + k * cuda.blockDim.x" in line for line in text_code)
    assert not any(re.search(r"=\s*\w+ \* ITEMS \+ k", line) and not line.startswith("#") for line in text_code)


def _tune_result(seconds_total=1.42, blocks=((256,), (128,))) -> autotune.TuneResult:
    rows = []
    for block in blocks:
        for items in (1, 2, 4, 8):
            rows.append(autotune.CandidateResult(block, 10e-6 / min(items, 4) + math.prod(block) * 1e-9,
                                                 tune=(("ITEMS", items),)))
    rows[7] = autotune.CandidateResult(blocks[1], skipped="results differ from the first candidate's",
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
    # 1-D blocks: a "threads" column would repeat the block column; 2-D blocks keep it
    assert ">threads</th>" not in html
    two_d = autotune_html(dataclasses.replace(kernel, autotune=_tune_result(blocks=((16, 16), (32, 8)))))
    assert ">threads</th>" in two_d and ">256</td>" in two_d

    from pnex_magic.render.report import PnexReport

    report = PnexReport.from_kernel(kernel, op, "copy_tuned")
    assert "8 candidates: 2 block shapes" in report.launch_html()
    assert "autotuned: 128, ITEMS=4" in report.header_html()
    plain = PnexReport.from_kernel(base, op, "copy_tuned")
    assert "autotune" not in plain.launch_html()  # a fixed block, no Tune: no table
    assert "<div>256 threads per block</div>" in plain.launch_html()  # 1-D: not "256 threads per block (256)"


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
    # 100 µs per call for 32 MiB: 0.336 TB/s; eager 400 µs; the copy 3.83 TB/s: TB/s everywhere
    timing = TimingResult(Measurement(10, 3, (1e-3,) * 3), Measurement(10, 3, (4e-3,) * 3), None, 32 << 20, "cuda:0")
    narrow = reasons(dataclasses.replace(FACTS, block=(4, 64, 1)))
    e = dataclasses.replace(efficiency(timing.bandwidth / H200.copy_bandwidth, narrow,
                                       eager=timing.eager_bandwidth, moved=32 << 20), device="Fake GPU")
    kernel = dataclasses.replace(base, autotune=result, timing=timing, efficiency=e, block=(4, 64, 1))
    report = PnexReport.from_kernel(kernel, op, "scale_k")
    launch = report.launch_html()
    assert "chose <code" in launch and "4.00×" in launch and "needs 131,072 blocks on axis Y" in launch
    assert "256 threads per block (4 × 64)" in launch and "tuning took" not in launch
    assert "autotuned: (4, 64)" in report.header_html()
    assert "4.00× vs eager" in report.header_html() and "4.00×</b> (eager median" in report.timing_html()  # one sign
    text = report.to_text()
    assert "autotune  : (4, 64) (benchmarked, 4.00x the first candidate's speed)" in text
    assert "* (4, 64)" in text and "skipped: needs 131,072 blocks" in text
    assert "ceiling   : 3.83 TB/s, the device-to-device copy, on Fake GPU" in text
    assert "memory    : copy 3.83 TB/s (measured); peak 4.8 TB/s" in text
    assert "bandwidth : 0.336 TB/s" in text and "GB/s" not in text  # one unit: the report's largest rate's
    assert "why       : below 85% of the ceiling: blocks too narrow along x: X size 4" in text
    assert "change    : use a block whose X covers at least 32 B of a row (X ≥ 8 here)" in text
    timing_html = report.timing_html()
    assert "bandwidth against the device's limits" in timing_html and "DRAM peak" in timing_html
    assert "why below 85% of the ceiling</b>: blocks too narrow along x" in timing_html
    assert "7% of peak · 9% of the ceiling · 0.336 TB/s<" in timing_html and "GB/s" not in timing_html


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
    # 10 loops per run: 53.5 µs per call (2.51 TB/s), torch.clone 34.7 µs
    timing = TimingResult(Measurement(10, 3, (535e-6,) * 3), Measurement(10, 3, (347e-6,) * 3), None, 134_217_728,
                          "cuda:0")
    e = efficiency(timing.bandwidth / H200.copy_bandwidth, reasons(copy_facts(1 << 24, 0.655)),
                   eager=timing.eager_bandwidth)
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
