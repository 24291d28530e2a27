"""The %%pnex cell magic, its report (HTML, text, widget), %pnex_cache and %pnex_doctor.

Every test drives a real IPython shell (``run_line_magic`` / ``run_cell_magic``
/ ``run_cell``) and asserts on ``user_ns``, on the report and its renderings, and
on the errors (tests/test_browser.py looks at the report in a browser).  Kernels run on CPU tensors through numba-cuda's CUDA simulator, so
sizes stay tiny (one 32-thread block).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import pnex_magic
from pnex_magic import cache, timing
from pnex_magic.blocks import AUTO_CANDIDATES
from pnex_magic.errors import (
    ArgumentTypeError,
    KernelDefinitionError,
    KernelLaunchError,
    KernelTypingError,
    PnexError,
    ShapeExpressionError,
)
from pnex_magic.launch import autotune
from pnex_magic.op import PnexOp
from pnex_magic.render.report import REDEFINED, SAME_OP

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402
from IPython.testing import globalipapp  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

COPY = '''
SCALE = 2.0

@cuda.jit(device=True)
def twice(v):
    return v * SCALE

def copy_k(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = twice(a[i]) / SCALE
'''

MULADD = '''
def muladd_k(
    a: In("f32", (None, None)),
    b: In("f32", ("a.size(0)", "a.size(1)")),
    c: float,
    result: Out("f32", "a"),
):
    x, y = cuda.grid(2)
    if y < result.shape[0] and x < result.shape[1]:
        result[y, x] = a[y, x] * b[y, x] + c
'''


@pytest.fixture(scope="module")
def ip():
    shell = globalipapp.get_ipython()  # the module's name: rebound to the shell once started
    shell.run_line_magic("load_ext", "pnex_magic")
    shell.run_cell("import torch")
    return shell


@pytest.fixture(autouse=True)
def magic_cache(tmp_path, monkeypatch):
    """A private build cache per test."""
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run(ip, line, cell):
    return ip.run_cell_magic("pnex", line, cell)


# --------------------------------------------------------------------------- the happy path


def test_extension_registers_the_magics(ip):
    magics = ip.magics_manager.magics
    assert "pnex" in magics["cell"]
    assert "pnex_cache" in magics["line"] and "pnex_doctor" in magics["line"]
    pnex_magic.unload_ipython_extension(ip)
    assert "pnex" not in ip.magics_manager.magics["cell"]
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_line_magic("reload_ext", "pnex_magic")
    assert "pnex" in ip.magics_manager.magics["cell"]


def test_help_is_generated_from_the_option_declarations(ip, capsys):
    ip.run_line_magic("pinfo", "%%pnex")
    text = capsys.readouterr().out
    for option in ("--n-threads", "--threads-per-block", "--to-extension", "--max-registers", "--cache-id",
                   "--verbose", "--arch", "--args", "--eager", "--name", "--force", "-o", "--output",
                   "--backward-of"):
        assert option in text, option
    assert "Compile the Numba-CUDA kernel in this cell" in text
    doc = ip.find_cell_magic("pnex").__doc__
    assert "--n-threads" in doc and "--eager" in doc


def test_cell_binds_the_op_and_its_helpers_and_leaves_history_alone(ip):
    ip.run_cell("x8 = torch.arange(8, dtype=torch.float32)", store_history=True)
    history_in, history_out = ip.user_ns["In"], ip.user_ns["Out"]
    n_in, out_items = len(history_in), dict(history_out)
    ip.user_ns.pop("copy_k", None)
    run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x8,) --eager torch.clone -o rep", COPY)
    ns = ip.user_ns
    assert isinstance(ns["copy_k"], PnexOp)
    torch.testing.assert_close(ns["copy_k"](ns["x8"]), ns["x8"])
    assert ns["SCALE"] == 2.0 and "twice" in ns  # the helpers the cell defined
    # The notebook's history is untouched: same objects, same contents.
    assert ns["In"] is history_in and ns["Out"] is history_out
    assert ns["In"] is ip.history_manager.input_hist_parsed
    assert len(ns["In"]) == n_in and dict(ns["Out"]) == out_items
    assert isinstance(ns["In"], list) and isinstance(ns["Out"], dict)
    # Injected names stay inside the cell.
    for name in ("InMut", "Scalar", "Unused"):
        assert name not in ns
    rep = ns["rep"]
    assert rep.bound_name == "copy_k" and rep.previous == ""
    assert rep.also_bound == ("SCALE", "twice")
    assert rep.kernel.schema.startswith("pnex::copy_k_") and rep.registers == rep.kernel.registers
    assert rep.n_threads_values == (8,) and rep.kernel.grid == (1, 1, 1) and rep.kernel.block == (32, 1, 1)
    c = rep.timing.correctness
    assert c.ok and c.max_abs_error == 0 and c.max_rel_error == 0
    assert rep.timing.op is None and "simulator" in rep.timing.reason  # no made-up timings
    # The kernel's globals hold what it reads, not the whole notebook.
    fn_globals = ns["copy_k"].definition.fn.__globals__
    assert "SCALE" in fn_globals and "twice" in fn_globals and "x8" not in fn_globals
    assert fn_globals["In"] is pnex_magic.In and fn_globals["Out"] is pnex_magic.Out


def test_rerun_reports_the_replaced_binding(ip):
    ip.user_ns["copy_k"] = "something else"
    run(ip, "--n-threads a.numel() --threads-per-block 32 -o rep", COPY)
    assert ip.user_ns["rep"].previous == "a str"
    first = ip.user_ns["copy_k"]
    # The same cell again: the same kernel, the same op; it says so instead of "replacing" it by itself.
    run(ip, "--n-threads a.numel() --threads-per-block 32 -o rep", COPY)
    assert ip.user_ns["copy_k"]._qualname == first._qualname
    assert ip.user_ns["rep"].previous == SAME_OP
    text = ip.user_ns["rep"].to_text()
    assert f"bound     : copy_k = {first._qualname} (the same op it held before: the same kernel, bound again)" in text
    assert "replacing" not in text and "replacing" not in ip.user_ns["rep"].header_html()
    # Another kernel under the same name: the op of that name is redefined (an op's name comes from
    # the kernel's name and module), and the report says so instead of "replacing" the op by itself.
    run(ip, "--n-threads a.numel() --threads-per-block 32 -o rep", COPY.replace("twice(a[i]) / SCALE", "-twice(a[i]) / SCALE"))
    assert ip.user_ns["copy_k"]._qualname == first._qualname
    assert ip.user_ns["rep"].previous == REDEFINED
    assert f"copy_k = {first._qualname} (redefining the op of this name that it held, made from another definition)" \
        in ip.user_ns["rep"].to_text()
    # A name that held another pnex op: that op, by its own name.
    ip.run_cell("other_k = copy_k")
    run(ip, "--n-threads a.numel() --threads-per-block 32 -o rep", COPY.replace("def copy_k(", "def other_k("))
    assert ip.user_ns["rep"].previous == f"the earlier pnex op {first._qualname}"
    assert f"(replacing the earlier pnex op {first._qualname})" in ip.user_ns["rep"].to_text()


def test_two_dimensional_launch_from_comma_separated_or_repeated_options(ip):
    ip.run_cell("A = torch.randn(4, 8); B = torch.randn(4, 8)")
    for line in (
        "--n-threads result.size(1),result.size(0) --threads-per-block 8,4",
        '--n-threads "result.size(1), result.size(0)" --threads-per-block 8,4',
        "--n-threads result.size(1) --n-threads result.size(0) --threads-per-block 8,4",
    ):
        run(ip, line + " --args (A, B, 0.5) --eager lambda a, b, c: a * b + c -o rep", MULADD)
        rep = ip.user_ns["rep"]
        assert rep.kernel.n_threads == ("result.size(1)", "result.size(0)")
        assert rep.n_threads_values == (8, 4) and rep.kernel.grid == (1, 1, 1) and rep.kernel.block == (8, 4, 1)
        assert rep.timing.correctness.ok
    A, B = ip.user_ns["A"], ip.user_ns["B"]
    torch.testing.assert_close(ip.user_ns["muladd_k"](A, B, 0.5), A * B + 0.5)


def test_the_parameter_table_spells_a_scalar_as_the_signature_does(ip):
    run(ip, "--n-threads result.size(1),result.size(0) --threads-per-block 8,4 -o rep", MULADD)
    html = ip.user_ns["rep"].signature_html()
    assert "c: float" in ip.user_ns["rep"].kernel.signature
    assert re.search(r"<td[^>]*><code[^>]*>c</code></td><td[^>]*><code[^>]*>float</code></td>"
                     r"<td[^>]*>argument, a float32 scalar</td>", html), html
    assert "Scalar(float32)" not in html


def test_inmut_kernel_is_checked_through_its_mutated_argument(ip):
    ip.run_cell("v = torch.arange(6, dtype=torch.float32)")
    run(ip, "--n-threads a.numel() --threads-per-block 32 --args (v, 3.0) --eager lambda a, s: a.add_(s) -o rep", '''
def add_inplace(a: InMut("f32", (None,)), s: Scalar("f32")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] += s
''')
    rep = ip.user_ns["rep"]
    assert rep.timing.correctness.ok and rep.timing.correctness.compared == ("a (mutated)",)
    torch.testing.assert_close(ip.user_ns["v"], torch.arange(6, dtype=torch.float32))  # --args ran on copies
    assert "written in place" in rep.signature_html()


def test_wrong_result_is_reported_not_raised(ip):
    ip.run_cell("w = torch.ones(5)")
    run(ip, "--n-threads a.numel() --threads-per-block 32 --args (w,) --eager torch.clone -o rep", '''
def off_by_one(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i] + 1.0
''')
    c = ip.user_ns["rep"].timing.correctness
    assert not c.ok and c.max_abs_error == 1.0 and c.max_rel_error == 1.0
    assert "DIFFERS" in ip.user_ns["rep"].to_html()


def test_several_kernels_need_name(ip):
    cell = '''
def first(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i]

def second(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = -a[i]
'''
    ip.user_ns.pop("first", None)
    with pytest.raises(UsageError, match="first, second.*--name"):
        run(ip, "--n-threads a.numel()", cell)
    run(ip, "--n-threads a.numel() --threads-per-block 32 --name second -o rep", cell)
    assert isinstance(ip.user_ns["second"], PnexOp) and "first" not in ip.user_ns
    assert ip.user_ns["rep"].skipped == ("first",)
    torch.testing.assert_close(ip.user_ns["second"](torch.ones(3)), -torch.ones(3))


def test_opcheck_on_a_magic_op(ip):
    run(ip, "--n-threads a.numel() --threads-per-block 32", COPY)
    torch.library.opcheck(ip.user_ns["copy_k"], (torch.arange(4, dtype=torch.float32),),
                          test_utils=("test_schema", "test_faketensor"))


# --------------------------------------------------------------------------- the report


def test_widget_structure_and_content(ip):
    import ipywidgets as w

    ip.run_cell("x8 = torch.arange(8, dtype=torch.float32)")
    run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x8,) --eager torch.clone -o rep", COPY)
    rep = ip.user_ns["rep"]
    view = rep.widget()
    assert isinstance(view, w.VBox)
    header, tab = view.children
    assert isinstance(header, w.HTML) and "copy_k" in header.value and "matches eager" in header.value
    assert isinstance(tab, w.Tab)
    assert tuple(tab.get_title(i) for i in range(6)) == ("Signature", "Launch", "PTX", "SASS", "Resources", "Timing")
    signature, launch, ptx, sass_tab, resources, timing_tab = (c.value for c in tab.children)
    assert all(isinstance(c, w.HTML) for c in tab.children)
    assert "pnex::copy_k_" in signature and "Tensor a) -&gt; Tensor" in signature
    assert "copy_k(a" in signature and "returns one tensor" in signature
    assert "a.numel()" in launch and "(1, 1, 1)" in launch and "(32, 1, 1)" in launch and ">8<" in launch
    assert ".entry" in ptx and "var(--jp-mirror-editor-keyword-color" in ptx and "SASS" not in ptx
    assert "SASS" in sass_tab or "not shown" in sass_tab
    assert "color-mix(in srgb, var(--jp-mirror-editor-keyword-color" in ptx  # readable on either theme
    assert f"{rep.registers}" in resources and "registers per thread" in resources and "occupancy" in resources
    assert "CUDA simulator" in timing_tab and "matches eager" in timing_tab and "all 8 elements of result" in timing_tab
    assert "max rel error" not in timing_tab  # the element-wise relative error misreads near zero
    assert "µs" not in timing_tab and "GB/s" not in timing_tab  # nothing timed without a GPU


def test_static_html_and_text_forms(ip):
    import html.parser
    import re

    run(ip, "--n-threads a.numel() --threads-per-block 32 -o rep", COPY)
    rep = ip.user_ns["rep"]
    page = rep.to_html()
    assert "<script" not in page and page.count("<style>") == 1 and "var(--jp-" in page  # theme colours
    titles = ("Signature", "Launch", "PTX", "SASS", "Resources", "Timing")

    class Parse(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.summaries, self.radios, self.open_panels, self.bar_style = [], [], [], 0, None
            self.fallback, self.rich_style, self.in_fallback = "", None, False

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag not in ("input", "br", "img"):  # void elements have no end tag
                self.stack.append(tag)
            if tag == "details" and "pnex-panel" in a.get("class", ""):
                self.open_panels += "open" in a
            if tag == "input":
                self.radios.append((a.get("type"), a.get("name"), "checked" in a))
            if "pnex-bar" in a.get("class", ""):
                self.bar_style = a.get("style")
            if "pnex-rich" in a.get("class", ""):
                self.rich_style = a.get("style")
            self.in_fallback = tag == "pre" and a.get("class") == "pnex-fallback"

        def handle_endtag(self, tag):
            self.stack.pop()
            self.in_fallback = False

        def handle_data(self, data):
            if self.in_fallback:
                self.fallback += data
            if self.stack and self.stack[-1] == "summary" and data in titles:
                self.summaries.append(data)

    parsed = Parse()
    parsed.feed(page)
    assert not parsed.stack  # well formed
    # Without the <style> block (a sanitiser), the rich view is hidden by its inline style and the
    # text summary shows (xarray's fallback); with it, the summary is hidden and the tabs show.
    assert parsed.rich_style == "display:none" and parsed.fallback == rep.summary()
    assert ".pnex-report>.pnex-fallback{display:none}" in page
    assert ".pnex-report>.pnex-rich{display:block!important}" in page
    assert "pnex kernel 'copy_k': bound copy_k = pnex::copy_k_" in parsed.fallback
    assert "registers per thread" in parsed.fallback
    assert ".entry" not in parsed.fallback and len(parsed.fallback) < 1500  # no listings: a compact summary
    # Without :has() or <input>, every section is an open <details> under its title and the tab bar
    # stays hidden by its inline style.
    assert parsed.summaries == list(titles) and parsed.open_panels == 6 and parsed.bar_style == "display:none"
    # With them, one radio group per rendering, the first tab checked.
    assert [(t, c) for t, _n, c in parsed.radios] == [("radio", True)] + [("radio", False)] * 5
    assert len({n for _t, n, _c in parsed.radios}) == 1
    again = set(re.findall(r'<input type="radio" name="([\w-]+)"', rep.to_html()))
    assert len(again) == 1 and again.isdisjoint(n for _t, n, _c in parsed.radios)  # two reports never share one
    text = rep.to_text()
    assert "pnex kernel 'copy_k'" in text and "registers :" in text and "bound     : copy_k = pnex::copy_k_" in text
    assert "give --args" in text
    # Static forms only, in a kernel too: a widget view would not survive the kernel.
    assert set(rep._repr_mimebundle_()) == {"text/plain", "text/html"}



def test_report_is_displayed_as_text_in_a_terminal_shell(ip, capsys):
    run(ip, "--n-threads a.numel() --threads-per-block 32", COPY)
    out = capsys.readouterr().out
    assert "pnex kernel 'copy_k'" in out and "signature :" in out


def test_progress_and_log_display_in_a_kernel(ip, monkeypatch, capsys):
    """In a Jupyter kernel the cell shows a progress bar, replaced by the report, and
    a failing cell shows the compiler log folded."""
    monkeypatch.setattr("pnex_magic.frontends.cell.in_kernel", lambda shell: True)
    run(ip, "--n-threads a.numel() --threads-per-block 32 -o rep", COPY)
    assert ip.user_ns["rep"].bound_name == "copy_k"
    with pytest.raises(KernelTypingError):
        run(ip, "--n-threads a.numel()", TYPING_ERROR)
    out = capsys.readouterr().out
    assert "compiler log" in out


def test_without_a_cuda_compiler_the_op_still_runs_in_the_simulator(ip, monkeypatch, capfd):
    from pnex_magic.definition import KernelDefinition

    def no_nvvm(self, arch=None, *, force=False):
        raise OSError("libNVVM cannot be found")

    monkeypatch.setattr(KernelDefinition, "compiled", no_nvvm)
    ip.run_cell("x8 = torch.arange(8, dtype=torch.float32)")
    run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x8,) --eager torch.clone -o rep", COPY)
    rep = ip.user_ns["rep"]
    assert "no CUDA compiler" in rep.not_compiled and rep.registers is None and rep.ptx == ""
    assert rep.timing.correctness.ok  # the simulator needs no compiler
    assert "no PTX" in rep.ptx_html() and "no resource figures" in rep.resources_html()
    assert "was not compiled" in rep.compile_log  # the core's warning, captured and shown folded
    assert "was not compiled" not in capfd.readouterr().err  # ... not printed to the terminal


def test_report_renders_gpu_timings(ip):
    run(ip, "--n-threads a.numel() --threads-per-block 32 -o rep", COPY)
    rep = ip.user_ns["rep"]
    op = timing.Measurement(loops=100, repeat=7, all_runs=(1e-3,) * 4 + (1.1e-3,) * 3)
    eager = timing.Measurement(loops=100, repeat=7, all_runs=(2e-3,) * 7)
    ok = timing.Correctness(0.0, 0.0, True, ("result",), 1.3e-6, 1e-5)
    rep.timing = timing.TimingResult(op, eager, ok, 8 << 20, "cuda:0 (Fake GPU)", name="copy_k",
                                     eager_name="torch.clone")
    tab = rep.widget().children[1]
    html = tab.children[5].value
    for words in ("median", "IQR", "runs × loops", "7 × 100", "GB/s", "speed-up", "2.00×", "matches eager", "µs"):
        assert words in html, words
    assert "2.00× vs eager" in rep.header_html() and "speed-up  : 2.00×" in rep.to_text()
    assert "copy_k 10 µs, torch.clone 20 µs: 2.00× eager's speed on cuda:0 (Fake GPU)" in rep.summary()


def test_progress_widget_steps_and_is_replaced(ip, capsys):
    import ipywidgets as w

    from pnex_magic.render.progress import Progress

    off = Progress(3, enabled=False)
    off.step("compiling")
    assert off.finish("report") is False and off.box is None
    progress = Progress(3, enabled=True)
    assert isinstance(progress.box, w.HBox) and isinstance(progress.bar, w.IntProgress)
    progress.step("compiling copy_k")
    assert progress.bar.value == 1 and "compiling copy_k" in progress.label.value
    for _ in range(5):
        progress.step("more")
    assert progress.bar.value == progress.bar.max == 3
    assert progress.finish("the report") is True and not progress.enabled
    assert "the report" in capsys.readouterr().out


def test_force_recompiles_and_the_cache_is_shared_with_jit(ip, magic_cache):
    line = "--n-threads a.numel() --threads-per-block 32 -o rep"
    run(ip, line, COPY)
    assert ip.user_ns["rep"].cache_hit is False
    run(ip, line, COPY)
    assert ip.user_ns["rep"].cache_hit is True
    run(ip, line + " --force", COPY)
    assert ip.user_ns["rep"].cache_hit is False
    from pnex_magic import cache

    hits = cache.stats.hits
    run(ip, line, COPY)  # the forced build was stored: a plain re-run hits it
    assert ip.user_ns["rep"].cache_hit is True and cache.stats.hits > hits
    run(ip, line + " --force --cache-id my_slot --max-registers 32 --to-extension --arch sm_80", COPY)
    rep = ip.user_ns["rep"]
    assert rep.cache_hit is False and rep.arch == "sm_80" and rep.max_registers == 32 and rep.to_extension


def test_verbose_prints_what_it_did(ip, capsys):
    run(ip, "--n-threads a.numel() --threads-per-block 32 --verbose", COPY)
    out = capsys.readouterr().out
    assert "pnex: copy_k(a: Tensor[float32" in out and "pnex: bound copy_k = pnex::copy_k_" in out


# --------------------------------------------------------------------------- errors

SCALED = '''
def scaled(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i] * FACTOR
'''

TYPING_ERROR = '''
def copy_k(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i] + "text"
'''


@pytest.fixture
def bound_copy(ip):
    ip.run_cell("x8 = torch.arange(8, dtype=torch.float32)")
    run(ip, "--n-threads a.numel() --threads-per-block 32", COPY)
    return ip.user_ns["copy_k"]


@pytest.mark.parametrize(
    ("cell", "error", "line", "words"),
    [
        ("\ndef copy_k(a: In('f32', (None,)), result: Out('f32', 'a'):\n    pass\n",
         KernelDefinitionError, 3, "invalid Python"),
        ("\ndef copy_k(a: In('f33', (None,)),\n           result: Out('f32', 'a')):\n    pass\n",
         KernelDefinitionError, 3, "unknown dtype 'f33'"),
        ("\ndef copy_k(a: In('f32', (None,)),\n           result: Out('f32', 'b')):\n    pass\n",
         ShapeExpressionError, 4, "'b' is not a tensor parameter"),
        ("\ndef copy_k(a: In('f32'),\n           result: Out('f32', 'a')):\n    pass\n",
         KernelDefinitionError, 3, "In(dtype, shape)"),
        (TYPING_ERROR, KernelTypingError, 6, "Numba could not compile"),
        ("\ndef copy_k(a: In('f32', (None,)), result: Out('f32', 'a')):\n    i = cuda.grid(1)\n"
         "    result[i] = a[i] * NOT_DEFINED\n", KernelTypingError, 5, "NOT_DEFINED"),
        ("\nimport not_a_module_pnex\n", KernelDefinitionError, 3, "ModuleNotFoundError"),
        ("\nx = 1\n", KernelDefinitionError, 2, "defines no kernel"),
        ("\n@cuda.jit\ndef copy_k(a: In('f32', (None,)), result: Out('f32', 'a')):\n    pass\n",
         KernelDefinitionError, 2, "remove the decorator"),
    ],
    ids=["syntax", "dtype", "shape", "missing-shape", "typing", "undefined-global", "import", "no-kernel",
         "decorated"],
)
def test_failing_cell_raises_one_error_at_its_line_and_keeps_the_binding(
    ip, bound_copy, magic_cache, cell, error, line, words
):
    def entries() -> list[str]:  # (the simulator's records of typed kernels are no builds)
        return sorted(p.name for p in magic_cache.iterdir() if p.name != "simulated")

    entries_before = entries()
    with pytest.raises(error) as info:
        run(ip, "--n-threads a.numel() --threads-per-block 32", cell)
    assert str(info.value).startswith(f"cell line {line}:"), str(info.value)
    assert words in str(info.value)
    assert info.value.cell_line == line
    assert ip.user_ns["copy_k"] is bound_copy
    torch.testing.assert_close(bound_copy(ip.user_ns["x8"]), ip.user_ns["x8"])
    assert entries() == entries_before  # failed builds are not cached
    rendered = "\n".join(info.value._render_traceback_())
    assert f"-->{line:>4} |" in rendered


def test_typing_error_carries_the_full_compiler_log(ip, bound_copy):
    with pytest.raises(KernelTypingError) as info:
        run(ip, "--n-threads a.numel()", TYPING_ERROR)
    assert "candidate implementations" in info.value.compiler_log  # the full log, folded away
    assert "candidate implementations" not in str(info.value)  # the message stays short
    assert info.value.lineno is None or info.value.lineno == 6
    # The cell line once (not "cell line 6: kernel 'copy_k' (line 6)"), and the log pointed at once:
    # below the message outside a notebook (in a notebook it is folded above the error instead).
    assert str(info.value).startswith("cell line 6: kernel 'copy_k': Numba could not compile"), str(info.value)
    assert "(line 6)" not in str(info.value) and "compiler_log" not in str(info.value)
    rendered = "\n".join(info.value._render_traceback_())
    assert rendered.count("compiler_log") == 1 and "sys.last_value.compiler_log" in rendered


def test_error_shows_concisely_through_ipython(ip, bound_copy, capsys):
    result = ip.run_cell("%%pnex --n-threads a.numel()\n" + TYPING_ERROR.lstrip("\n"))
    assert isinstance(result.error_in_exec, KernelTypingError)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "KernelTypingError" in text and 'result[i] = a[i] + "text"' in text
    assert "site-packages" not in text and "magic.py" not in text  # no traceback through pnex
    assert ip.user_ns["copy_k"] is bound_copy


@pytest.mark.parametrize(
    ("line", "error", "words"),
    [
        ("--args (no_such_name,)", PnexError, "NameError"),
        ("--args (x8, x8)", ArgumentTypeError, "takes 1 argument"),
        ("--args (x8.double(),)", ArgumentTypeError, "must be a float32 tensor"),
        ("--args (x8,) --eager torch.no_such_function", PnexError, "--eager"),
        ("--args (x8,) --eager 3", PnexError, "not a callable"),
        ("--args (x8,) --eager lambda a: a.reshape(3, 5)", PnexError, "calling it on --args \\(x8,\\) raised"),
    ],
)
def test_bad_args_or_eager_raise_and_keep_the_binding(ip, bound_copy, line, error, words):
    with pytest.raises(error, match=words) as info:
        run(ip, "--n-threads a.numel() --threads-per-block 32 " + line, COPY)
    assert str(info.value).startswith("cell line 1 (the %%pnex line):")
    assert ip.user_ns["copy_k"] is bound_copy


def test_bad_args_are_caught_before_the_op_is_registered(ip):
    ip.run_cell("x4 = torch.arange(4, dtype=torch.float32); FACTOR = 2.0")
    run(ip, "--n-threads a.numel() --threads-per-block 32", SCALED)
    before = ip.user_ns["scaled"]
    ip.run_cell("FACTOR = 3.0")
    with pytest.raises(ArgumentTypeError):
        run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x4.long(),)", SCALED)
    assert ip.user_ns["scaled"] is before
    x4 = ip.user_ns["x4"]
    torch.testing.assert_close(before(x4), 2 * x4)  # the old kernel is still registered


def test_kernel_fault_on_args_restores_the_previous_op(ip):
    ip.run_cell("x4 = torch.arange(4, dtype=torch.float32); FACTOR = 2.0")
    run(ip, "--n-threads a.numel() --threads-per-block 32", SCALED)
    before = ip.user_ns["scaled"]
    # Compiles and registers fine, then faults on the example arguments: no bounds check.
    with pytest.raises(KernelLaunchError, match="cell line 1"):
        run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x4,)", SCALED.replace(
            "    if i < a.shape[0]:\n        result[i]", "    if True:\n        result[i]"))
    restored = ip.user_ns["scaled"]
    assert restored.definition is before.definition  # the previous kernel, registered again
    x4 = ip.user_ns["x4"]
    torch.testing.assert_close(restored(x4), 2 * x4)
    torch.testing.assert_close(getattr(torch.ops.pnex, before._name)(x4), 2 * x4)


RESCALED = SCALED.replace("def scaled(", "def rescaled(")
RESCALED_WITH_OFFSET = RESCALED.replace('Out("f32", "a"))', 'Out("f32", "a"), offset: float = 1.5)').replace(
    "* FACTOR", "* FACTOR + offset"
)
assert RESCALED_WITH_OFFSET.count("offset") == 2


def test_rerun_keeps_earlier_objects_live_or_makes_them_fail_clearly(ip):
    """Re-running a cell: earlier op objects (a model built before) call the new kernel
    while the signature stays, and raise, naming the redefinition, once it changes."""
    ip.run_cell("x4 = torch.randn(4); FACTOR = 2.0")
    x4 = ip.user_ns["x4"]
    run(ip, "--n-threads a.numel() --threads-per-block 32", RESCALED)
    first = ip.user_ns["rescaled"]
    torch.testing.assert_close(first(x4), 2 * x4)
    ip.run_cell("FACTOR = 5.0")
    run(ip, "--n-threads a.numel() --threads-per-block 32", RESCALED)  # same signature, new body
    second = ip.user_ns["rescaled"]
    assert second is not first
    torch.testing.assert_close(first(x4), 5 * x4)
    torch.testing.assert_close(second(x4), 5 * x4)
    # Another signature (a scalar with a default), checked on --args that leave it out.
    run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x4,) --eager lambda a: a * 5 + 1.5 -o rep",
        RESCALED_WITH_OFFSET)
    assert ip.user_ns["rep"].timing.correctness.ok
    third = ip.user_ns["rescaled"]
    torch.testing.assert_close(third(x4), 5 * x4 + 1.5)
    torch.testing.assert_close(third(x4, -1.0), 5 * x4 - 1.0)
    for old in (first, second):
        with pytest.raises(KernelDefinitionError, match=r"(?s)rescaled\(\): this op object is from an earlier "
                           r"definition, rescaled\(a: Tensor\[float32, \(None,\)\]\) -> .*; the op was redefined "
                           r"at .+ as rescaled\(a: Tensor\[float32, \(None,\)\], offset: float = 1.5\).*Use the object"):
            old(x4)
    torch.testing.assert_close(getattr(torch.ops.pnex, third._name)(x4), 5 * x4 + 1.5)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("", "needs --n-threads"),
        ("--args (x8,)", "needs --n-threads"),
        ("--n-threads a.numel() --threads-per-block 0", "positive"),
        ("--n-threads a.numel() --threads-per-block 8,x", "N\\[,N\\[,N\\]\\]"),
        ("--n-threads a.numel() --max-registers -2", "positive"),
        ("--n-threads a.numel() --max-registers lots", "invalid int"),
        ("--n-threads a.numel() --arch xyz", "unknown GPU architecture"),
        ("--n-threads a.numel() --no-such-option", "unrecognized arguments"),
        ("--n-threads a.numel() --name nope", "no function of that name"),
        ("--n-threads a.numel() --eager torch.clone", "--eager needs --args"),
        ("--n-threads a.numel() -o 1x", "Python name"),
        ("--n-threads a.numel() -o Out", "history"),
        ("--n-threads a, b, c, d", "at most 3"),
        ("--n-threads a.numel() --backward-of x8", "not a pnex op"),
        ("--n-threads a.numel() --args 'unbalanced", "cannot split"),
    ],
)
def test_option_errors_are_usage_errors(ip, bound_copy, line, words):
    with pytest.raises(UsageError, match=words):
        run(ip, line, COPY)
    assert ip.user_ns["copy_k"] is bound_copy


def test_backward_of_attaches_through_autograd(ip):
    autograd = pytest.importorskip("pnex_magic.autograd")
    assert hasattr(autograd, "attach_backward")
    ip.run_cell("xg = torch.arange(4, dtype=torch.float32)")
    run(ip, "--n-threads x.numel() --threads-per-block 32", '''
def double_fw(x: In("f32", (None,)), y: Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = 2.0 * x[i]
''')
    run(ip, "--n-threads grad_y.numel() --threads-per-block 32 --backward-of double_fw -o rep", '''
def double_bw(grad_y: In("f32", (None,)), grad_x: Out("f32", "grad_y")):
    i = cuda.grid(1)
    if i < grad_y.shape[0]:
        grad_x[i] = 2.0 * grad_y[i]
''')
    assert ip.user_ns["rep"].backward_of == "double_fw"
    x = ip.user_ns["xg"].clone().requires_grad_()
    ip.user_ns["double_fw"](x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


# --------------------------------------------------------------------------- output capture


def test_compiler_output_is_captured_at_the_file_descriptor_level(capfd):
    import warnings

    from pnex_magic.frontends.capture import capture_output

    with capture_output() as captured:
        print("python stdout")
        print("python stderr", file=sys.stderr)
        os.write(1, b"native stdout\n")
        os.write(2, b"native stderr\n")
        warnings.warn("a compiler warning", stacklevel=1)
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""  # nothing reached the terminal
    for text in ("python stdout", "python stderr", "native stdout", "native stderr", "a compiler warning"):
        assert text in captured.text


# --------------------------------------------------------------------------- %pnex_cache and %pnex_doctor


def test_pnex_cache_lists_and_clears(ip, magic_cache):
    empty = ip.run_line_magic("pnex_cache", "")
    assert len(empty) == 0 and str(magic_cache) in str(empty)
    run(ip, "--n-threads a.numel() --threads-per-block 32", COPY)
    run(ip, "--n-threads a.numel() --threads-per-block 32 --arch sm_80", COPY)
    listing = ip.run_line_magic("pnex_cache", "")
    assert len(listing) == 2
    assert {r.arch for r in listing} == {"sm_75", "sm_80"} and all(r.kernel == "copy_k" for r in listing)
    assert all(r.size_bytes > 0 and r.registers for r in listing)
    assert "copy_k" in str(listing) and "<table" in listing._repr_html_()
    assert len(ip.run_line_magic("pnex_cache", "--kernel nothing_like_it")) == 0
    cleared = ip.run_line_magic("pnex_cache", "--clear --kernel copy_k")
    assert cleared.removed == 2 and "removed 2" in str(cleared)
    assert len(ip.run_line_magic("pnex_cache", "")) == 0
    with pytest.raises(UsageError):
        ip.run_line_magic("pnex_cache", "--bogus")


def test_pnex_doctor_reports_the_environment(ip):
    report = ip.run_line_magic("pnex_doctor", "")
    names = {c.name for c in report.checks}
    assert {"torch", "GPU", "NVIDIA driver", "numba-cuda", "NVVM", "nvJitLink", "NVRTC", "SASS", "build cache"} <= names
    assert report["torch"].detail.startswith(torch.__version__)
    if not torch.cuda.is_available():
        assert report["GPU"].status == "warn" and "simulator" in report["GPU"].detail
    if report["SASS"].status != "ok":
        assert any("cuobjdump" in a and a.startswith("pip install") for a in report.advice)
    assert "pnex doctor" in str(report) and "<table" in report._repr_html_()
    with pytest.raises(UsageError):
        ip.run_line_magic("pnex_doctor", "--what")


# --------------------------------------------------------------------------- timing (statistics on CPU)


class FakeTimer:
    """Each call of fn costs `per_call` seconds, plus `jitter[i]` on run i."""

    def __init__(self, per_call, jitter=()):
        self.per_call = per_call
        self.jitter = list(jitter)
        self.calls = []

    def __call__(self, fn, loops):
        self.calls.append(loops)
        extra = self.jitter.pop(0) if self.jitter and len(self.calls) > 2 else 0.0
        return loops * self.per_call + extra


def test_measure_picks_loops_and_computes_statistics():
    timer = FakeTimer(10e-6)
    m = timing.measure(lambda: None, timer, repeat=5, warmup=3, min_run_seconds=1e-3)
    assert timer.calls[:2] == [3, 1]  # warm-up, then a one-call probe
    assert m.loops == 100 and m.repeat == 5 and len(m.all_runs) == 5 and timer.calls[2:] == [100] * 5
    assert m.median == pytest.approx(10e-6) and m.iqr == pytest.approx(0) and m.best == pytest.approx(10e-6)
    timer = FakeTimer(1e-6, jitter=[0, 1e-4, 2e-4, 3e-4, 4e-4])
    m = timing.measure(lambda: None, timer, repeat=5, loops=100, warmup=0)
    per_call = sorted(m.timings)
    assert m.median == pytest.approx(per_call[2]) and m.best == pytest.approx(per_call[0])
    assert m.q1 == pytest.approx(per_call[1]) and m.q3 == pytest.approx(per_call[3])
    assert m.iqr == pytest.approx(per_call[3] - per_call[1]) and m.worst == pytest.approx(per_call[4])
    assert "5 runs × 100 loops" in str(m) and "µs" in str(m)
    assert timing._nice_loops(3) == 5 and timing._nice_loops(11) == 20 and timing._nice_loops(1e5) == 100000
    with pytest.raises(ValueError):
        timing.measure(lambda: None, timer, repeat=0)


def test_timing_result_speedup_bandwidth_and_text():
    op = timing.Measurement(loops=10, repeat=3, all_runs=(10e-5, 10e-5, 12e-5))
    eager = timing.Measurement(loops=10, repeat=3, all_runs=(20e-5, 20e-5, 20e-5))
    c = timing.Correctness(0.0, 0.0, True, ("result",), 1.3e-6, 1e-5)
    r = timing.TimingResult(op, eager, c, bytes_moved=8_000_000, device="cuda:0 (Fake GPU)", name="copy",
                            eager_name="torch.clone")
    assert r.speedup == pytest.approx(2.0) and r.bandwidth == pytest.approx(8e6 / 10e-6)
    text = str(r)
    assert "speed-up  : 2.00×" in text and "800 GB/s" in text and "copy" in text and "torch.clone" in text
    none = timing.TimingResult(None, None, c, 0, "cpu (CUDA simulator)", reason="no GPU")
    assert none.speedup is None and none.bandwidth is None and "not timed : no GPU" in str(none)


def test_compare_outputs():
    a = torch.tensor([1.0, 2.0, 4.0])
    assert timing.compare_outputs([a], [a.clone()], ["r"]).ok
    c = timing.compare_outputs([a], [torch.tensor([1.0, 2.5, 4.0])], ["r"])
    assert not c.ok and c.max_abs_error == pytest.approx(0.5) and c.max_rel_error == pytest.approx(0.2)
    c = timing.compare_outputs([torch.tensor([0.0, float("nan")])], [torch.tensor([1e-9, float("nan")])], ["r"])
    assert c.ok and c.max_abs_error == pytest.approx(1e-9)  # NaN where eager has NaN is a match
    assert not timing.compare_outputs([a], [a[:2]], ["r"]).ok
    assert not timing.compare_outputs([a], [a, a], ["r"]).ok
    ints = torch.tensor([1, 2, 3])
    assert not timing.compare_outputs([ints], [ints + 1], ["i"]).ok  # integers must match exactly
    assert timing.compare_outputs([a.half()], [a.double()], ["h"]).note  # dtype differences are noted


def test_a_pass_reads_as_a_pass_and_a_failure_names_the_worst_element():
    """Near zero, one rounding is a large relative error: the check passes, and the block says
    so with the largest difference against the reference's scale.  A poisoned element fails
    it, and is named with both values."""
    gen = torch.Generator().manual_seed(30)
    ref = torch.randn(64, 48, generator=gen, dtype=torch.float64)
    ref[3, 5] = 1e-9  # an element near zero
    out = ref.to(torch.float32)
    out[3, 5] = 1.05e-9  # within atol, 5% relative
    c = timing.compare_outputs([out], [ref.to(torch.float32)], ["result"])
    assert c.ok and c.max_rel_error > 0.04 and c.mismatched == 0 and c.worst is None and c.elements == 64 * 48
    assert c.scaled_error == pytest.approx(c.max_abs_error / float(ref.abs().max()), rel=1e-6) and c.scaled_error < 1e-8
    assert str(c).startswith("matches eager: all 3,072 elements of result within rtol=1.3e-06, atol=1e-05")
    from pnex_magic.render.report import correctness_html

    html = correctness_html(c)
    assert "matches eager" in html and "max rel error" not in html and "of the largest reference value" in html
    bad = out.clone()
    row, col = torch.randint(0, 64, (1,), generator=gen).item(), torch.randint(0, 48, (1,), generator=gen).item()
    bad[row, col] += 0.5
    bad[0, 0] += 1e-4  # also outside the tolerance, by less
    c = timing.compare_outputs([bad], [out], ["result"])
    assert not c.ok and c.mismatched == 2 and c.worst.index == (row, col)
    assert c.worst.actual == pytest.approx(float(bad[row, col])) and c.worst.expected == pytest.approx(float(out[row, col]))
    assert f"worst: result[{row}, {col}] = {float(bad[row, col]):.6g} where eager gives {float(out[row, col]):.6g}" in str(c)
    html = correctness_html(c)
    assert "DIFFERS from eager" in html and "2 of 3,072 elements of result" in html and f"result[{row}, {col}]" in html
    # several outputs: the worst over all of them; a mutated argument keeps its own name
    c = timing.compare_outputs([out, bad], [out, out], ["x (mutated)", "y"])
    assert c.worst.output == "y" and str(c.worst).startswith(f"y[{row}, {col}] = ")


def test_a_failure_is_located_without_importing_sympy():
    """A fresh notebook's first report of a kernel that disagrees with eager paid 1-2 s for
    sympy (``torch.unravel_index`` imports torch's symbolic shapes): the worst element's
    index is found in plain Python, in a process that has not imported sympy."""
    code = (
        "import sys, torch\n"
        "from pnex_magic import timing\n"
        "assert 'sympy' not in sys.modules\n"
        "ref = torch.zeros(3, 5, 7)\n"
        "bad = ref.clone(); bad[2, 1, 4] = 1.0; bad[0, 0, 0] = 0.5\n"
        "c = timing.compare_outputs([bad], [ref], ['r'])\n"
        "print(c.worst.index, c.mismatched, 'sympy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-5:] == ["(2,", "1,", "4)", "2", "False"]


def test_evaluate_times_with_any_timer_and_checks_correctness(ip):
    run(ip, "--n-threads a.numel() --threads-per-block 32", COPY)
    op = ip.user_ns["copy_k"]
    x = torch.arange(4, dtype=torch.float32)
    timer = FakeTimer(5e-6)
    r = timing.evaluate(op, (x,), torch.clone, output_names=["result"], time_it=True, timer=timer, repeat=3)
    assert r.op is not None and r.eager is not None and r.correctness.ok
    assert r.bytes_moved == 2 * 4 * 4 and r.speedup == pytest.approx(1.0)
    untimed = timing.evaluate(op, (x,), torch.clone, output_names=["result"])
    assert untimed.op is None and untimed.reason and untimed.correctness.ok


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_timing_path(ip):
    ip.run_cell("xg = torch.arange(1 << 20, dtype=torch.float32, device='cuda')")
    run(ip, "--n-threads a.numel() --args (xg,) --eager torch.clone -o rep", COPY)
    t = ip.user_ns["rep"].timing
    assert t.op is not None and t.eager is not None and t.op.median > 0 and t.bandwidth > 0
    assert t.correctness.ok and "cuda" in t.device


# --------------------------------------------------------------------------- highlighting and SASS


def test_ptx_lexer_and_highlighting():
    from pygments.token import Comment, Keyword, Name

    from pnex_magic.render.listings import PtxLexer, SassLexer, highlight

    ptx = "// comment\n.reg .b32 %r<5>;\n@%p1 bra $L__BB0_2;\n\tld.param.u64 %rd1, [param_0];\n$L__BB0_2:\n\tret;\n"
    tokens = [(t, v) for t, v in PtxLexer().get_tokens(ptx) if v.strip()]
    assert (Comment.Single, "// comment") in tokens
    assert (Keyword, "ld.param.u64") in tokens and (Keyword, "bra") in tokens and (Keyword, "ret") in tokens
    assert (Name.Variable, "%rd1") in tokens and (Name.Label, "$L__BB0_2") in tokens
    html = highlight(ptx, PtxLexer())
    assert "%r&lt;5&gt;" in html and "<5>" not in html and "&lt;" in html
    sass = "        /*0000*/                   MOV R1, c[0x0][0x28] ;  /* 0x000 */\n"
    stokens = [(t, v) for t, v in SassLexer().get_tokens(sass) if v.strip()]
    assert (Keyword, "MOV") in stokens and (Name.Variable, "R1") in stokens


def test_tidy_sass_drops_encodings():
    from pnex_magic.sass import tidy_sass

    raw = (
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */\n"
        "                                                                          /* 0x000fe40000000f00 */\n"
        "        /*0010*/                   S2R R2, SR_TID.X ;                     /* 0x0000000000027919 */\n"
    )
    assert tidy_sass(raw) == (
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
        "        /*0010*/                   S2R R2, SR_TID.X ;\n"
    )


def test_real_sass_when_the_toolkit_has_a_disassembler(ip):
    from pnex_magic import sass

    if sass.find_disassembler() is None:
        if os.environ.get("CI"):  # the test command installs the sass extra: a skip would hide the SASS path
            pytest.fail('no cuobjdump or nvdisasm under CI: install the sass extra (pip install -e ".[cu13,test,sass]")')
        pytest.skip('no cuobjdump or nvdisasm here (pip install "pnex_magic[sass]")')
    run(ip, "--n-threads a.numel() --threads-per-block 32 -o rep", COPY)
    rep = ip.user_ns["rep"]
    assert rep.sass and "MOV" in rep.sass.text and "/* 0x" not in rep.sass.text
    assert "SASS</b> (" in rep.sass_html() and "SASS" not in rep.ptx_html()
    # one line count everywhere: the tab's, the text report's and the listing's own
    lines = len(rep.sass.text.splitlines())
    assert f"SASS</b> ({lines} lines" in rep.sass_html() and f"sass      : {lines} lines" in rep.to_text()


GATED = '''
def gated_k(a: In("f32", (None,)), b: In("f32", "a"), out: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        one = float32(1.0)
        out[i] = a[i] * (one / (one + math.exp(-b[i])))
'''


def test_the_sass_listing_opens_at_the_kernel_not_a_helper(ip):
    """The quickstart's gated kernel: its division makes ptxas add a helper function
    (``__cuda_sm20_rcp_rn_f32_slowpath``), which cuobjdump lists before the kernel: the SASS
    tab starts at the kernel, and names the helper."""
    from pnex_magic import sass

    if sass.find_disassembler() is None:
        if os.environ.get("CI"):
            pytest.fail('no cuobjdump or nvdisasm under CI: install the sass extra (pip install -e ".[cu13,test,sass]")')
        pytest.skip('no cuobjdump or nvdisasm here (pip install "pnex_magic[sass]")')
    ip.run_cell("import math\nfrom numba import float32")
    run(ip, "--n-threads a.numel() --arch sm_90 -o rep", GATED)
    rep = ip.user_ns["rep"]
    names = rep.sass.functions
    assert names[0] == rep.kernel.entry and [n for n in names[1:] if n.startswith("__cuda_")], names
    html = rep.sass_html()
    assert "the kernel first, then the helper function it calls: " in html and "slowpath" in html
    listing = rep.sass.text
    assert listing.index(rep.kernel.entry) < listing.index("Function : __cuda_")
    raw = sass.disassemble(rep.op.definition.compiled("sm_90").cubin)  # the disassembler's own order, with entry=""
    assert raw.functions[0] != rep.kernel.entry and sorted(raw.functions) == sorted(names)
    assert len(raw.text.splitlines()) == len(listing.splitlines())  # reordered, not cut
    assert f"{len(listing.splitlines())} lines (cuobjdump); the kernel first, then 1 helper function" in rep.to_text()


def test_kernel_first_reorders_both_disassemblers_listings():
    from pnex_magic.sass import Disassembly

    cuobjdump = ("\n\tcode for sm_90\n\n\t\tFunction : helper\n\t.headerflags\t@x\n        /*0000*/ MOV R1 ;\n"
                 "\t\t..........\n\n\n\t\tFunction : kern\n        /*0000*/ EXIT ;\n\t\t..........\n")
    first = Disassembly(cuobjdump, "cuobjdump").kernel_first("kern")
    assert first.functions == ("kern", "helper") and first.text.startswith("\n\tcode for sm_90\n\n\t\tFunction : kern")
    assert sorted(first.text.splitlines()) == sorted(cuobjdump.splitlines())
    assert first.kernel_first("kern") == first and Disassembly(cuobjdump, "x").kernel_first("nope").text == cuobjdump
    nvdisasm = ("\t.headerflags\t@x\n\t.section\t.text.helper,\"ax\",@progbits\n  MOV R1 ;\n"
                "\t.section\t.text.kern,\"ax\",@progbits\n  EXIT ;")
    assert Disassembly(nvdisasm, "nvdisasm").kernel_first("kern").functions == ("kern", "helper")


def test_sass_is_shown_when_a_disassembler_exists(monkeypatch, tmp_path):
    from pnex_magic import sass as widget

    monkeypatch.setattr(widget, "find_disassembler", lambda: None)
    widget._disassemble_cached.cache_clear()
    missing = widget.disassemble(b"\x7fELF fake cubin")
    assert not missing and "pip install" in missing.reason
    assert not widget.disassemble(None) and "nvJitLink" in widget.disassemble(None).reason
    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\necho '        /*0000*/   MOV R1, c[0x0][0x28] ;'\n")
    tool.chmod(0o755)
    monkeypatch.setattr(widget, "find_disassembler", lambda: ("cuobjdump", str(tool)))
    widget._disassemble_cached.cache_clear()
    shown = widget.disassemble(b"\x7fELF another fake cubin")
    assert shown and "MOV R1" in shown.text and shown.tool == "cuobjdump"
    widget._disassemble_cached.cache_clear()


# --------------------------------------------------------------------------- terminal IPython and the notebook


def test_works_in_plain_terminal_ipython(tmp_path):
    script = tmp_path / "session.ipy"
    script.write_text(textwrap.dedent('''\
        %load_ext pnex_magic
        import torch
        x = torch.arange(5, dtype=torch.float32)
        '''))
    code = (
        "get_ipython().run_line_magic('run', " + repr(str(script)) + ")\n"
        "get_ipython().run_cell_magic('pnex', '--n-threads a.numel() --threads-per-block 32 --args (x,) "
        "--eager torch.clone', " + repr(COPY) + ")\n"
        "print('RESULT', copy_k(x).tolist(), type(In).__name__, type(Out).__name__)\n"
    )
    env = dict(os.environ, PNEX_CACHE_DIR=str(tmp_path / "cache"))
    ipython = [sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", "--HistoryManager.enabled=False"]
    done = subprocess.run(ipython + ["-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RESULT [0.0, 1.0, 2.0, 3.0, 4.0] list dict" in done.stdout
    assert "pnex kernel 'copy_k'" in done.stdout and "matches eager" in done.stdout


def test_quickstart_notebook_runs_headless(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # A private kernel spec whose kernel is this interpreter, whatever "python3" Jupyter finds.
    spec_dir = tmp_path / "jupyter" / "kernels" / "pnex-quickstart"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "pnex test kernel", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "nbcache"))
    path = ROOT / "notebooks" / "01_quickstart.ipynb"
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="pnex-quickstart", resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError on any untagged error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    kinds = {k for o in outputs for k in o.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" not in kinds and "text/html" in kinds
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert [o["ename"] for o in errors] == ["KernelTypingError"]  # the one tagged raises-exception
    html = "".join(o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {}))
    assert "pnex::mymuladd" in html and "matches eager" in html and "compiler log" in html
    assert "pnex-tabs" in html  # the report's tabs need no widget state


# --------------------------------------------------------------------------- autotune options

SCALE_CELL = '''
def scale_k(a: In("f32", (None, None)), s: int, out: Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[y, x] * s
'''


@pytest.mark.parametrize(
    "option, candidates",
    [
        ("--threads-per-block auto", AUTO_CANDIDATES[2]),
        ("--threads-per-block [(4, 2), (8, 8)]", ((4, 2), (8, 8))),
        ("--threads-per-block '[(8, 4),(2,2)]' --autotune-key a.size(0),s", ((8, 4), (2, 2))),
    ],
)
def test_magic_threads_per_block_auto_and_lists(ip, option, candidates):
    ip.run_cell("grid_x = torch.randn(3, 5)")
    ip.run_cell_magic("pnex", f'--n-threads "out.size(1), out.size(0)" {option} --args (grid_x, 3) -o rep', SCALE_CELL)
    rep = ip.user_ns["rep"]
    assert rep.op.spec.candidates == candidates
    assert rep.kernel.autotune.block == candidates[0]  # the simulator runs the first candidate
    assert "autotune" in rep.launch_html() and "autotune  :" in rep.to_text()
    if "--autotune-key" in option:
        assert [str(e) for e in rep.op.spec.autotune_key] == ["a.size(0)", "s"]
        assert "a.size(0)=3, s=3" in rep.kernel.autotune.key_text
    torch.testing.assert_close(ip.user_ns["scale_k"](ip.user_ns["grid_x"], 3), ip.user_ns["grid_x"] * 3)


def test_magic_autotune_option_errors(ip):
    with pytest.raises(UsageError, match=r"--threads-per-block expects a list of candidates such as \[128, 256\]"):
        ip.run_cell_magic("pnex", '--n-threads a.numel() --threads-per-block "[1, 2"', SCALE_CELL)
    with pytest.raises(KernelDefinitionError, match=r"cell line 1 .*threads_per_block candidate 0 \(8\) is an int"):
        ip.run_cell_magic("pnex", '--n-threads "out.size(1), out.size(0)" --threads-per-block [8,16]', SCALE_CELL)
    with pytest.raises(KernelDefinitionError, match=r"cell line 1 .*autotune_key=\('a.size\(0\)',\) is given but"):
        ip.run_cell_magic("pnex", '--n-threads "out.size(1), out.size(0)" --autotune-key a.size(0)', SCALE_CELL)


def test_pnex_cache_lists_and_clears_autotune_choices(ip, magic_cache):
    data = {"kernel": "__main__.scale_k", "gpu": "Fake GPU", "key_text": "a.size(0)=1024, contiguous inputs",
            "candidates": [{"block": [16, 16], "seconds": 3e-6}, {"block": [4, 64], "seconds": 1e-6}],
            "choice": [4, 64]}
    cache.store_record(autotune.RECORD_KIND, "a" * 64, data)
    cache.store_record(autotune.RECORD_KIND, "b" * 64, {**data, "kernel": "__main__.other"})
    listing = ip.run_line_magic("pnex_cache", "")
    assert len(listing.choices) == 2
    row = next(c for c in listing.choices if c.kernel == "scale_k")
    assert (row.choice, row.speedup, row.gpu) == ("(4, 64)", pytest.approx(3.0), "Fake GPU")
    assert "autotune choices: 2" in str(listing) and "3.00×" in listing._repr_html_()
    cleared = ip.run_line_magic("pnex_cache", "--clear --kernel scale_k")
    assert cleared.removed == 1
    assert [c.kernel for c in ip.run_line_magic("pnex_cache", "").choices] == ["other"]
    # --clear removes every part of the folder (pnex_magic.cache.PARTS), but those --keep names.
    cache.store_record("sass", "c" * 64, {"text": "IMAD"})
    listing = ip.run_line_magic("pnex_cache", "")
    assert "also: 1 SASS listing (" in str(listing) and "also: 1 SASS listing" in listing._repr_html_()
    cleared = ip.run_line_magic("pnex_cache", "--clear --keep autotune")
    assert cleared.removed == 1 and "removed 1 SASS listing; kept autotune choices" in str(cleared)
    assert len(ip.run_line_magic("pnex_cache", "").choices) == 1
    with pytest.raises(UsageError, match=r"--keep: .*no part named 'choices'; the parts are kernels, autotune"):
        ip.run_line_magic("pnex_cache", "--clear --keep choices")
    with pytest.raises(UsageError, match="--keep goes with --clear"):
        ip.run_line_magic("pnex_cache", "--keep autotune")
    cleared = ip.run_line_magic("pnex_cache", "--clear")
    assert cleared.cleared.removed["autotune"] == 1 and cleared.removed == 1
    assert ip.run_line_magic("pnex_cache", "").choices == ()


TUNE_CELL = """
def tcopy(a: In("f32", (None,)), r: Out("f32", "a"), ITEMS: Tune(1, 2, 4)):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            r[j] = a[j]
"""


def test_magic_tune_annotation_and_overrides(ip):
    ip.run_cell("tx = torch.randn(37)")
    line = '--n-threads "(a.numel() + ITEMS - 1) // ITEMS" --threads-per-block 8 --args tx -o rep'
    ip.run_cell_magic("pnex", line, TUNE_CELL)
    rep = ip.user_ns["rep"]
    assert rep.op.spec.tune_variants == ((1,), (2,), (4,))
    assert torch.equal(ip.user_ns["tcopy"](ip.user_ns["tx"]), ip.user_ns["tx"])
    assert rep.kernel.autotune.tune == (("ITEMS", 1),)  # the simulator runs the first choice
    assert "Tune (ITEMS: 1, 2, 4)" in rep.to_text()
    ip.run_cell_magic("pnex", line + " --tune ITEMS=4,8", TUNE_CELL)
    assert ip.user_ns["rep"].op.spec.tune_variants == ((4,), (8,))
    assert ip.user_ns["rep"].n_threads_values == (10,)  # (37 + 3) // 4 for the first choice
    with pytest.raises(UsageError, match=r"--tune expects NAME=CHOICE\[,CHOICE...\]"):
        ip.run_cell_magic("pnex", line + " --tune ITEMS", TUNE_CELL)
    with pytest.raises(UsageError, match=r"--tune ITEMS: 'x' is not a number or a bool"):
        ip.run_cell_magic("pnex", line + " --tune ITEMS=1,x", TUNE_CELL)
    with pytest.raises(KernelDefinitionError, match=r"cell line 1 .*choices are given for 'a', which is an In parameter"):
        ip.run_cell_magic("pnex", line + " --tune a=1,2", TUNE_CELL)
    with pytest.raises(KernelDefinitionError, match=r"Tune choices must be ints, floats or bools"):
        ip.run_cell_magic("pnex", line + " --tune ITEMS=1,2.5", TUNE_CELL)


OVERRUN_CELL = """
def overrun(a: In("f32", (None,)), r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i + 1] = a[i]
"""


def test_magic_check_names_the_access_and_keeps_the_binding(ip):
    from pnex_magic import KernelIndexError

    ip.run_cell("ox = torch.randn(20)")
    with pytest.raises(KernelIndexError, match=r"cell line 1 .*--args ox: overrun\(\): index 20 is out of bounds for "
                       r"axis 0 of parameter 'r' \(shape \(20,\)\), at line 6: `r\[i \+ 1\] = a\[i\]`"):
        ip.run_cell_magic("pnex", "--n-threads a.numel() --check --args ox", OVERRUN_CELL)
    assert "overrun" not in ip.user_ns  # nothing bound
    with pytest.raises(UsageError, match="--sanitize needs --args"):
        ip.run_cell_magic("pnex", "--n-threads a.numel() --sanitize", OVERRUN_CELL)


def test_in_a_notebook_the_report_shows_before_its_sass_listing_is_made(ip, monkeypatch):
    """In a Jupyter kernel the cell shows its report as soon as it is built, with a note
    where the SASS listing goes, then replaces it in the same output with the listing
    (the disassembler takes 0.2-0.5 s to start); the bound report ends complete."""
    from IPython.display import DisplayHandle

    from pnex_magic.frontends import cell as cell_module
    from pnex_magic.render.report import PnexReport
    from pnex_magic.sass import PendingDisassembly, find_disassembler

    if find_disassembler() is None:
        pytest.skip("no cuobjdump/nvdisasm here (pip install 'pnex_magic[sass]')")
    shown = []

    def update(self, obj, **kwargs):
        if isinstance(obj, PnexReport):
            shown.append((type(obj.sass), bool(obj.sass), obj.kernel.sass == obj.sass))

    monkeypatch.setattr(cell_module, "in_kernel", lambda shell: True)
    monkeypatch.setattr(DisplayHandle, "update", update)
    run(ip, "--n-threads 'out.size(1), out.size(0)' -o rep_later", SCALE_CELL)
    if not ip.user_ns["rep_later"].kernel.ptx:
        pytest.skip("no NVVM here: nothing to disassemble")
    assert shown[0][0] is PendingDisassembly and shown[0][1] is False  # shown with the note first
    assert shown[-1][1] is True and shown[-1][2] is True and len(shown) == 2  # then the listing
    rep = ip.user_ns["rep_later"]
    assert rep.sass and "LDG" in rep.sass.text
