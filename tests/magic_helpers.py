"""What the tests of the %%pnex magic share (tests/test_magic_*.py): two cells, the IPython
shell with the extension loaded, a private build cache per test and ``run(ip, line, cell)``."""

from __future__ import annotations

import pytest

IPython = pytest.importorskip("IPython")
from IPython.testing import globalipapp  # noqa: E402


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


TYPING_ERROR = '''
def copy_k(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i] + "text"
'''
