"""A kernel bug never costs the notebook (issue 21), in a real Jupyter kernel on a GPU.

One kernel (ipykernel, driven by nbclient as a notebook front end would) runs every
case in order: a ``%%pnex --check`` cell whose kernel reads or writes out of bounds
(1-D, 2-D and 3-D; an ``Out`` write, an ``InMut`` update and an ``In`` read) fails
with a ``KernelIndexError`` naming the parameter, the index, the shape and the line,
and the next cells still run: ``torch.ones(4, device="cuda").sum()`` and a correct
pnex op.  Without ``--check``, the magic's first run of a new kernel on ``--args``
is checked anyway.  Each case is its own test; they share the kernel, as cells of
one session do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]

SETUP = f"""
import sys, torch
sys.path.insert(0, {str(ROOT)!r})
%load_ext pnex_magic
gx = torch.randn(1000, device="cuda")
"""

GOOD = """%%pnex --n-threads a.numel() --args gx
def good(a: In("f32", (None,)), r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = a[i] * 2
"""

AFTER = """
assert torch.ones(4, device="cuda").sum().item() == 4.0
assert torch.equal(good(gx), gx * 2)
print("session alive")
"""

# name -> (cell, parameter, index, axis, shape, line of the access in the cell)
CASES = {
    "out_1d": ("""%%pnex --check --n-threads a.numel() --args (torch.randn(100, device="cuda"),)
def out_1d(a: In("f32", (None,)), r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i + 1] = a[i]
""", "r", 100, 0, "(100,)", 5),
    "inmut_1d": ("""%%pnex --check --n-threads x.numel() --args (torch.zeros(64, device="cuda"),)
def inmut_1d(x: InMut("f32", (None,))):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i + 1] += 1.0
""", "x", 64, 0, "(64,)", 5),
    "in_1d": ("""%%pnex --check --n-threads a.numel() --args (torch.randn(50, device="cuda"),)
def in_1d(a: In("f32", (None,)), r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = a[i + 1]
""", "a", 50, 0, "(50,)", 5),
    "out_2d": ("""%%pnex --check --n-threads "a.size(1), a.size(0)" --args (torch.randn(20, 33, device="cuda"),)
def out_2d(a: In("f32", (None, None)), r: Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < a.shape[0] and x < a.shape[1]:
        r[y + 1, x] = a[y, x]
""", "r", 20, 0, "(20, 33)", 5),
    "inmut_2d": ("""%%pnex --check --n-threads "x.size(1), x.size(0)" --args (torch.zeros(8, 40, device="cuda"),)
def inmut_2d(x: InMut("f32", (None, None))):
    i, j = cuda.grid(2)
    if j < x.shape[0] and i < x.shape[1]:
        x[j, i + 1] = 1.0
""", "x", 40, 1, "(8, 40)", 5),
    "in_2d": ("""%%pnex --check --n-threads "a.size(1), a.size(0)" --args (torch.randn(16, 16, device="cuda"),)
def in_2d(a: In("f32", (None, None)), r: Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < a.shape[0] and x < a.shape[1]:
        r[y, x] = a[x, y + 1]
""", "a", 16, 1, "(16, 16)", 5),
    "out_3d": ("""%%pnex --check --n-threads "a.size(2), a.size(1), a.size(0)" --args (torch.randn(4, 5, 6, device="cuda"),)
def out_3d(a: In("f32", (None, None, None)), r: Out("f32", "a")):
    x, y, z = cuda.grid(3)
    if z < a.shape[0] and y < a.shape[1] and x < a.shape[2]:
        r[z, y, x + 1] = a[z, y, x]
""", "r", 6, 2, "(4, 5, 6)", 5),
    "inmut_3d": ("""%%pnex --check --n-threads "x.size(2), x.size(1), x.size(0)" --args (torch.zeros(3, 4, 5, device="cuda"),)
def inmut_3d(x: InMut("f32", (None, None, None))):
    i, j, k = cuda.grid(3)
    if k < x.shape[0] and j < x.shape[1] and i < x.shape[2]:
        x[k + 1, j, i] -= 1.0
""", "x", 3, 0, "(3, 4, 5)", 5),
    "in_3d": ("""%%pnex --check --n-threads "a.size(2), a.size(1), a.size(0)" --args (torch.randn(2, 3, 4, device="cuda"),)
def in_3d(a: In("f32", (None, None, None)), r: Out("f32", "a")):
    x, y, z = cuda.grid(3)
    if z < a.shape[0] and y < a.shape[1] and x < a.shape[2]:
        r[z, y, x] = a[z, y + 1, x]
""", "a", 3, 1, "(2, 3, 4)", 5),
}


@pytest.fixture(scope="module")
def session():
    """One notebook kernel for the module: ``run(source)`` executes a cell and returns
    its outputs (errors included)."""
    nb = nbformat.v4.new_notebook()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    client = nbclient.NotebookClient(nb, timeout=600, allow_errors=True, kernel_name="python3")
    with client.setup_kernel(env=env):

        def run(source: str) -> list[dict]:
            cell = nbformat.v4.new_code_cell(source)
            nb.cells.append(cell)
            client.execute_cell(cell, len(nb.cells) - 1)
            return cell.outputs

        outputs = run(SETUP)
        assert not _errors(outputs), _text(outputs)
        outputs = run(GOOD)
        assert not _errors(outputs), _text(outputs)
        yield run


def _errors(outputs: list[dict]) -> list[dict]:
    return [o for o in outputs if o.get("output_type") == "error"]


def _text(outputs: list[dict]) -> str:
    parts = []
    for o in outputs:
        if o.get("output_type") == "error":
            parts.append(f"{o['ename']}: {o['evalue']}")
            parts += [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in o.get("traceback", [])]
        elif o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        else:
            parts.append(str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def _assert_alive(run) -> None:
    outputs = run(AFTER)
    assert not _errors(outputs) and "session alive" in _text(outputs), _text(outputs)


@pytest.mark.parametrize("case", list(CASES))
def test_out_of_bounds_under_check_is_named_and_the_session_survives(session, case):
    cell, param, index, axis, shape, line = CASES[case]
    outputs = session(cell)
    [error] = _errors(outputs)
    assert error["ename"] == "KernelIndexError", _text(outputs)
    message = error["evalue"]
    assert f"index {index} is out of bounds for axis {axis} of parameter {param!r} (shape {shape})" in message
    assert f"at line {line}: `" in message and re.search(r"thread \(\d+, \d+, \d+\) of block \(\d+, \d+, \d+\)", message)
    _assert_alive(session)


def test_first_run_on_args_is_checked_without_the_option(session):
    cell = CASES["out_2d"][0].replace("--check ", "").replace("def out_2d", "def unchecked_2d")
    outputs = session(cell)
    [error] = _errors(outputs)
    assert error["ename"] == "KernelIndexError" and "of parameter 'r' (shape (20, 33))" in error["evalue"]
    _assert_alive(session)
    # the same kernel fixed: the report says the checked run found nothing
    fixed = cell.replace("r[y + 1, x] = a[y, x]", "r[y, x] = a[y, x]") + ""
    outputs = session(fixed.replace("--args", "-o fixed_rep --args"))
    assert not _errors(outputs), _text(outputs)
    outputs = session("print(fixed_rep.kernel.checked_run)")
    assert "found no access out of bounds" in _text(outputs)


def test_a_fault_without_checks_names_the_way_out(session):
    """Checks off and the first run skipped (a plain call): the context is lost, and the
    message says so, names the kernel and points at --check / --sanitize.  Run last."""
    outputs = session(
        "import pnex_magic as pnex\n"
        "from numba import cuda\n"
        "@pnex.jit(n_threads='a.numel()')\n"
        "def wild(a: pnex.In('f32', (None,)), r: pnex.Out('f32', 'a')):\n"
        "    i = cuda.grid(1)\n"
        "    r[i * 100000000] = a[i]\n"
        "y = wild(torch.randn(4096, device='cuda'))\n"
        "torch.cuda.synchronize()\n"
    )
    text = _text(outputs)
    assert _errors(outputs), text
    following = session("torch.ones(4, device='cuda').sum().item()")
    combined = text + "\n" + _text(following)
    assert "wild" in combined and "--check" in combined and "context" in combined.lower(), combined
