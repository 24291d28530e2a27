"""The %%pnex cell magic: what a cell binds, its launch options, its output captured, and the
magic in terminal IPython and in a headless notebook.

Every test drives a real IPython shell (``run_line_magic`` / ``run_cell_magic``
/ ``run_cell``) and asserts on ``user_ns``, on the report and its renderings, and
on the errors (tests/test_browser.py looks at the report in a browser).  Kernels run on CPU tensors
through numba-cuda's CUDA simulator, so sizes stay tiny (one 32-thread block).
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
from pnex_magic.op import PnexOp
from pnex_magic.render.report import REDEFINED, SAME_OP

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402

from magic_helpers import COPY, MULADD, ip, magic_cache, run  # noqa: F401 (fixtures: ip, magic_cache)

ROOT = Path(__file__).resolve().parents[1]


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
