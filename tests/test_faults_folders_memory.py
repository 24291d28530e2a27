"""The fault matrix, unusable cache folders and long sessions:

* a read-only cache folder, and one whose parent does not exist: kernels compile
  and run, the first says once why nothing is cached;
* 300 definitions and 100,000 calls in one process: resident memory grows by a
  bounded amount per definition and not at all per call.

Each case runs in subprocesses (a kill must not take pytest down).  Sizes are small.  Each
test prints its figures (``pytest -s tests/test_faults*.py``)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelCompileError, cache
from pnex_magic.launch import background

from faults_helpers import PROBE_SOURCE, _check_whole_entries, _env, _results, _script


# ---------------------------------------------------------------- unusable cache folders


def _read_only_folder(tmp_path: Path) -> Path:
    """An existing folder this process cannot write into."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    candidates = [folder, Path("/sys/kernel"), Path("/proc/self/fdinfo")]  # root ignores permission bits
    for candidate in candidates:
        try:
            (candidate / ".pnex-probe").mkdir()
        except OSError:
            return candidate
        (candidate / ".pnex-probe").rmdir()
    pytest.fail("found no folder that cannot be written")


def _define_new_kernel(k: float):
    @pnex.jit(n_threads="a.numel()")
    def uncached(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] - k

    return uncached


def test_read_only_cache_folder_compiles_runs_and_says_why(tmp_path, monkeypatch, caplog):
    folder = _read_only_folder(tmp_path)
    before = sorted(p.name for p in folder.iterdir())
    monkeypatch.setenv("PNEX_CACHE_DIR", str(folder))
    monkeypatch.setattr(cache, "_warned_unwritable", set())
    a = torch.randn(9)
    with caplog.at_level(logging.WARNING, logger="pnex_magic.cache"):
        for k in (0.5, 1.5):
            op = _define_new_kernel(k)
            torch.testing.assert_close(op(a), a - k)
            assert pnex.inspect(op).cache_hit is False
    warnings = [r.getMessage() for r in caplog.records if r.name == "pnex_magic.cache"]
    assert len(warnings) == 1, warnings  # said once, not per kernel
    assert f"the compile cache folder {folder} cannot be written" in warnings[0]
    assert "PNEX_CACHE_DIR" in warnings[0]
    assert sorted(p.name for p in folder.iterdir()) == before
    # The C++ launcher's one-time build says the same instead of failing obscurely.
    source = tmp_path / "probe.cpp"
    source.write_text(PROBE_SOURCE)
    with pytest.raises(KernelCompileError, match=rf"build folder {re.escape(str(folder))}/launcher/\S+ cannot be written"):
        background.build_extension("pnex_probe", [source], includes=[], what="probe extension")


def test_cache_folder_whose_parent_does_not_exist_is_created(tmp_path, monkeypatch):
    folder = tmp_path / "not" / "yet" / "there" / "cache"
    monkeypatch.setenv("PNEX_CACHE_DIR", str(folder))
    a = torch.randn(6)
    op = _define_new_kernel(2.5)
    torch.testing.assert_close(op(a), a - 2.5)
    [entry] = _check_whole_entries(folder)
    assert entry.meta["key"] == pnex.inspect(op).cache_key
    again = _define_new_kernel(2.5)
    assert pnex.inspect(again).cache_hit is True
    torch.testing.assert_close(again(a), a - 2.5)


# ---------------------------------------------------------------- resident memory

MEMORY = """
import gc, json, os, sys, weakref
import torch
from numba import cuda
import pnex_magic as pnex

device, definitions, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

def define(k):
    @pnex.jit(n_threads="a.numel()")
    def memory_kernel(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * k
    return memory_kernel

# Empty tensors on CPU: the op's whole Python path runs, the (slow) simulator launches nothing.
a = torch.randn(4096, device=device) if device == "cuda" else torch.empty(0)
def sync():
    if device == "cuda":
        torch.cuda.synchronize()

warm = 20
first = []
for k in range(warm):
    op = define(float(k))
    op(a)
    first.append(weakref.ref(op))
del op
sync(); gc.collect()
before = rss_mb()
for k in range(warm, warm + definitions):
    op = define(float(k))  # a new kernel each time: compiled, registered, called once
    out = op(a)
    assert out.shape == a.shape
sync(); gc.collect()
after_definitions = rss_mb()
if device == "cuda":
    torch.testing.assert_close(op(a), a * float(warm + definitions - 1))
for _ in range(10_000):
    op(a)
sync(); gc.collect()
before_calls = rss_mb()
for i in range(calls):
    op(a)
    if i % 10_000 == 0:
        sync()
sync(); gc.collect()
after_calls = rss_mb()
print("RESULT " + json.dumps({
    "mb_per_definition": (after_definitions - before) / definitions,
    "mb_per_100k_calls": (after_calls - before_calls) * 100_000 / calls,
    "rss_mb": after_calls,
    "earlier_objects_alive": sum(r() is not None for r in first),
    "launcher": "native" if getattr(op, "_native", False) else "python",
}), flush=True)
"""


def _memory(tmp_path, pnex_env, device: str) -> dict:
    script = _script(tmp_path, "memory.py", MEMORY)
    proc = subprocess.run([sys.executable, str(script), device, "300", "100000"],
                          env=_env(pnex_env, tmp_path / "cache"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [figures] = _results(proc.stdout)
    print(f"\n[faults] memory ({device}): " + ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    return figures


@pytest.mark.slow
def test_resident_memory_stays_flat_over_definitions_and_calls(tmp_path, pnex_env):
    figures = _memory(tmp_path, pnex_env, "cpu")
    assert figures["mb_per_definition"] < 0.5  # measured about 0.05 MB on CPU
    assert figures["mb_per_100k_calls"] < 4.0  # measured 0


@pytest.mark.gpu
def test_resident_memory_stays_flat_through_the_cpp_launcher(tmp_path, pnex_env):
    figures = _memory(tmp_path, pnex_env, "cuda")
    assert figures["launcher"] == "native"
    assert figures["mb_per_definition"] < 1.0
    assert figures["mb_per_100k_calls"] < 4.0
