"""The public switch that turns pnex's disk cache off for one kernel: ``jit(cache=False)``
and ``%%pnex --no-cache`` (``JitOptions(use_cache=False)``, whose effects on each kind of
cached item are tested beside them: test_autotune.py, test_code_version.py)."""

from __future__ import annotations

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import cache
from pnex_magic.errors import KernelDefinitionError
from pnex_magic.report import _definition_of
from toolchain import needs_nvvm


def _define(use_cache: bool, factor: float = 3.0):
    @pnex.jit(n_threads="a.numel()", cache=use_cache)
    def scaled(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * factor

    return scaled


def _cached_files(folder):
    """The files under the cache folder, the code version's digests apart (the package's,
    not the kernel's)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                  and "code-version" not in p.as_posix())


@needs_nvvm
def test_jit_cache_false_reads_and_writes_nothing_of_the_kernel(fresh_cache):
    a = torch.randn(37)
    off = _define(False)
    torch.testing.assert_close(off(a), a * 3.0)  # the simulator
    _definition_of(off, "test").compiled("sm_80")
    assert cache.entries() == [] and cache.stats.hits == 0
    assert not [f for f in _cached_files(fresh_cache) if "scaled" in f or "sim" in f]

    on = _define(True)  # the same code: its builds are stored
    _definition_of(on, "test").compiled("sm_80")
    stored = cache.entries()
    assert stored
    again = _define(False)  # ... and not read by a kernel with the cache off
    hits = cache.stats.hits
    _definition_of(again, "test").compiled("sm_80")
    assert cache.stats.hits == hits and cache.entries() == stored
    assert _definition_of(again, "test").options.use_cache is False


def test_cache_must_be_a_bool():
    with pytest.raises(KernelDefinitionError, match=r"cache must be True or False, got 'no'"):
        pnex.jit(n_threads="a.numel()", cache="no")


def test_the_magic_turns_the_cache_off(fresh_cache):
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_cell_magic("pnex", '--n-threads "a.numel()" --no-cache', (
        "def tripled(a: In('f32', (None,)), out: Out('f32', 'a')):\n"
        "    i = cuda.grid(1)\n"
        "    if i < a.shape[0]:\n"
        "        out[i] = a[i] * 3.0\n"))
    op = ip.user_ns["tripled"]
    assert _definition_of(op, "test").options.use_cache is False
    a = torch.randn(11)
    torch.testing.assert_close(op(a), a * 3.0)
    assert cache.entries() == []
