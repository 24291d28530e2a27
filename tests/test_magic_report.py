"""The %%pnex report: its widget, static HTML and text forms, progress, timings shown, cache
hits, and its PTX and SASS listings.

Every test drives a real IPython shell (``run_line_magic`` / ``run_cell_magic``
/ ``run_cell``) and asserts on ``user_ns``, on the report and its renderings, and
on the errors (tests/test_browser.py looks at the report in a browser).  Kernels run on CPU tensors
through numba-cuda's CUDA simulator, so sizes stay tiny (one 32-thread block).
"""

from __future__ import annotations

import os

import pytest

from pnex_magic import timing
from pnex_magic.errors import KernelTypingError

from magic_helpers import COPY, TYPING_ERROR, ip, magic_cache, run  # noqa: F401 (fixtures: ip, magic_cache)

IPython = pytest.importorskip("IPython")


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
    assert rep.sass and "EXIT" in rep.sass.text and "/* 0x" not in rep.sass.text  # (any arch's code ends so)
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
