"""What the report's first screens say, on CPU and for recorded GPU runs (issue 36).

* A CPU run's report says, before any tab is opened, that the op runs in the CUDA
  simulator and that the architecture, registers and occupancy shown are those of a
  stand-in compile target; the untrusted summary and the text say so too; the SASS tab
  asks nobody without a GPU to install disassemblers.
* Success shows as success: an op at the ceiling gets a green verdict and badge, and a
  tie with eager is no warning; badges never break over two lines.
* The bandwidth bars: each as long as its share of the peak, its label leading with
  that share, the DRAM peak's bar filled, a line at 85% of the ceiling, labels on one line.
* "What to change" shows the kernel's own shape (a 2-D kernel gets a 2-D template), and
  the template runs (in the simulator) and computes what the kernel computes.
* The launch-bound advice names CUDA graphs only where a graph's replay measured faster.
* Rates and shares too small for the report's unit are written in their own, not as 0.

The GPU runs' reports are made on CPU from recorded figures (``tests/report_samples.py``).
"""

from __future__ import annotations

import html
import math
import re

import pytest
import torch
from IPython.testing import globalipapp

from pnex_magic.efficiency import FAR, GRAPH_GAIN, reasons
from pnex_magic.render.html import OK, WARN
from pnex_magic.render.report import speed_colour
from pnex_magic.sass import NO_DISASSEMBLER, SASS_ADVICE, Disassembly
from pnex_magic.timing import format_bytes, format_rate
from pnex_magic.tune_template import tune_template
from report_samples import gated_report, lltm_forward_report, muladd_2d_report, naive_copy_report, tuned_copy_report

COPY_CELL = '''
def copy_s(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i]
'''


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("a CPU run's report: this machine has a GPU")
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "pnex_magic")
    shell.run_cell("import torch\nxs = torch.arange(8, dtype=torch.float32)")
    shell.run_cell_magic("pnex", "--n-threads a.numel() --threads-per-block 32 --args (xs,) --eager torch.clone -o rep_s",
                         COPY_CELL)
    return shell.user_ns["rep_s"]


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#x27;", "'")


def test_a_cpu_report_says_simulator_and_stand_in_on_its_first_screen(cpu_report):
    k = cpu_report.kernel
    assert k.stand_in and k.arch == "sm_75"
    header = _text(cpu_report.header_html())  # above the tabs: what shows first
    assert "sm_75 (stand-in target)" in header and "CUDA simulator" in header
    assert ("No GPU here: the op runs in numba-cuda's CUDA simulator (on CPU tensors), and the PTX, SASS, registers "
            "and occupancy shown are those of sm_75, a stand-in compile target") in header
    summary = cpu_report.summary()  # what an untrusted notebook shows instead
    assert "resources : sm_75 (a stand-in compile target: no GPU here), 12 registers per thread" in summary
    assert "the op ran in the CUDA simulator" in summary
    assert 600 <= len(summary) <= 1000, len(summary)
    assert "target    : sm_75 (a stand-in compile target: no GPU here, the op runs in the CUDA simulator" in str(
        cpu_report)
    assert "for sm_75, a stand-in compile target (no GPU here)" in _text(cpu_report.resources_html())


def test_without_a_gpu_the_sass_tab_asks_for_nothing(cpu_report):
    missing = Disassembly(None, None, f"{NO_DISASSEMBLER}: {SASS_ADVICE}")
    cpu_report.sass = missing
    text = _text(cpu_report.sass_html())
    assert "no disassembler here" in text and "none is needed to run kernels in the simulator" in text
    assert "pip install" not in text and "CUDA 13" not in text and "pip install" not in str(cpu_report)
    # On a machine with a GPU, the same missing tool is worth installing: the advice stays.
    gpu = naive_copy_report()
    gpu.sass = missing
    assert "pip install" in gpu.sass_html()


def test_success_shows_as_success_and_badges_stay_whole():
    tuned = tuned_copy_report()  # 105% of the copy, 1.00x torch.clone: the clone is the ceiling
    e = tuned.kernel.efficiency
    assert e.at_ceiling and not e.far and not e.near
    header = tuned.header_html()
    assert re.search(r'color:[^"]*success[^"]*;[^"]*white-space:nowrap[^"]*">100% of the ceiling<', header), header
    tie = re.search(r'<span style="([^"]*)">1\.00× vs eager</span>', header).group(1)
    assert WARN not in tie and OK not in tie and "white-space:nowrap" in tie  # a tie: neither warning nor win
    timing = tuned.timing_html()
    verdict = ("100% of the ceiling (3.87 TB/s, the eager reference, on this call's bytes): at the ceiling, faster "
               "than every rate measured for this call")
    assert re.search(r'<div style="color:[^"]*success[^"]*"><b>at the ceiling</b>: ' + re.escape(html.escape(verdict)), timing)
    assert f"verdict   : {verdict}" in str(tuned)
    assert speed_colour(1.00) != WARN and speed_colour(0.66) == WARN and speed_colour(11.77) == OK
    naive = naive_copy_report()  # 68% of the copy, 65% of torch.clone (the ceiling): the warning's colour, and why
    assert "65% of the ceiling</span>" in naive.header_html() and "why below 85% of the ceiling" in naive.timing_html()


def test_the_bars_say_what_their_length_shows():
    html = gated_report().timing_html()  # 2.95 TB/s, eager 2 TB/s, copy 4.07 TB/s, peak 4.81 TB/s
    rows = re.findall(r"<tr>(.*?)</tr>", html[html.index("bandwidth against"):])
    bars = {re.sub(r"<[^>]+>", "", r.split("</td>")[0]): r for r in rows[:4]}
    assert list(bars) == ["gated", "lambda a, b, c: a * torch.sigmoid(b) + c", "device-to-device copy", "DRAM peak"]
    # recorded without the streaming kernels, the report falls back on the copy as the memory's ceiling
    for name, share in (("gated", 2.95 / 4.81), ("device-to-device copy", 4.07 / 4.81), ("DRAM peak", 1.0)):
        assert f"width:{share * 100:.1f}%" in bars[name], name  # the length: the share of the peak
    assert ">61% of peak · 72% of the ceiling · 2.95 TB/s</span>" in bars["gated"]  # the label leads with it
    assert "white-space:nowrap" in bars["gated"]  # and stays on one line
    peak_fill = re.search(r"width:100\.0%;([^\"]*)\"", bars["DRAM peak"]).group(1)
    assert "background:#6b6b6b" in peak_fill  # a filled bar, not an empty track
    line = f"left:{FAR * 4.07 / 4.81 * 100:.1f}%"  # 85% of the copy, on the peak's scale
    assert all(line in bar for bar in bars.values())
    assert "the line across the bars: 85% of the ceiling, below which the report says why" in html


def test_a_two_dimensional_kernel_gets_a_two_dimensional_template():
    report = muladd_2d_report()  # 05_colab's muladd: too few bytes in flight
    found = report.kernel.efficiency.explanation
    assert found.kind == "in flight"
    assert "rows block-strided (y = base + k * cuda.blockDim.y)" in found.advice
    assert found.code.startswith("@pnex.jit(n_threads=('result.size(1)', '(result.size(0) + ITEMS - 1) // ITEMS')")
    assert "def muladd(" in found.code and "result[y, x] = a_v[k] * b_v[k] + c" in found.code
    assert "x = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x" in found.code
    assert "cuda.grid(1)" not in found.code and "a.numel()" not in found.code
    assert "def gated(" not in gated_report().to_text()  # the unexplained gated kernel shows no template


def _run_template(code: str, name: str, namespace: dict):
    import pnex_magic as pnex
    from numba import cuda, float32

    import linecache

    ns = {"pnex": pnex, "cuda": cuda, "float32": float32, "math": math, "In": pnex.In, "Out": pnex.Out, **namespace}
    # As a user would paste it into a cell: IPython keeps a cell's source in linecache, which the
    # simulator's typed form is built from.
    filename = f"<template-{name}-{abs(hash(code))}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    exec(compile(code, filename, "exec"), ns)  # noqa: S102 -- the report's template, run as a user would paste it
    return ns[name]


@pytest.mark.parametrize("items", [1, 4])
def test_the_templates_compute_what_the_kernels_compute(items, monkeypatch):
    """Each template, pasted and run in the simulator with a given ITEMS, gives the kernel's
    results (fresh random inputs, sizes that leave a ragged edge)."""
    import report_samples as rs

    monkeypatch.setenv("PNEX_AUTOTUNE", "0")
    src = __import__("inspect").getsource
    gated_code = tune_template(pnex_spec(rs.gated, "a.numel()"), src(rs.gated))
    op = _run_template(gated_code.replace("pnex.Tune(1, 2, 4, 8)", f"pnex.Tune({items})"), "gated", {"pnex": rs.pnex})
    a, b, c = (torch.randn(75) for _ in range(3))
    torch.testing.assert_close(op(a, b, c), a * torch.sigmoid(b) + c)
    muladd_code = tune_template(pnex_spec(rs.muladd, ("result.size(1)", "result.size(0)")), src(rs.muladd))
    op2 = _run_template(muladd_code.replace("pnex.Tune(1, 2, 4, 8)", f"pnex.Tune({items})"), "muladd", {})
    x, y = torch.randn(9, 13), torch.randn(9, 13)
    out = op2(x, y, 0.5)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, x * y + 0.5)


def pnex_spec(fn, n_threads):
    import pnex_magic as pnex

    return pnex.jit(n_threads=n_threads)(fn).spec


def test_cuda_graphs_are_advised_only_where_a_replay_measured_faster():
    plain = lltm_forward_report().kernel.efficiency.explanation  # 7.91 µs a call, no graph measured
    assert plain.kind == "launch" and "graph" not in plain.advice
    faster = lltm_forward_report(graph_us=2.1).kernel.efficiency.explanation
    assert faster.advice.startswith("replayed in a CUDA graph, a call took 2.1 µs (measured here): capture the calls")
    same = lltm_forward_report(graph_us=7.9 * GRAPH_GAIN + 0.5).kernel.efficiency.explanation
    assert "no faster: a graph would not help" in same.advice and "capture" not in same.advice
    facts = lltm_forward_report(graph_us=2.1).kernel.efficiency.facts
    assert [r.kind for r in reasons(facts)][0] == "launch"


def test_small_rates_and_shares_keep_their_digits():
    text = str(lltm_forward_report())  # 48 KiB in 7.91 µs: 6.21 GB/s; eager 842 MB/s; the copy 4.07 TB/s
    assert "op        : 6.21 GB/s = <1% of the ceiling, <1% of peak" in text
    assert "eager     : 842 MB/s = <1%" in text and "0.000" not in text and "= 0%" not in text
    assert format_rate(8.41e8, (1e12, "TB/s")) == "841 MB/s" and format_rate(9.44e10, (1e12, "TB/s")) == "0.0944 TB/s"
    assert format_bytes(62_914_560) == "60 MiB" and format_bytes(268_435_456) == "256 MiB"
    assert format_bytes(8192) == "8 KiB" and format_bytes(100) == "100 B"
