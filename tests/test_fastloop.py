"""First-use speed, kept as behaviour (issue 20): ``import pnex_magic`` imports no
Numba and prints nothing; a compile-cache hit runs no part of Numba's compiler; the
``cuda`` that ``%%pnex`` cells get is ``numba.cuda`` imported on first use, and
compiles, fingerprints and simulates like the module; the simulator still sees the
globals a kernel read when it was defined; a kernel's SASS listing is kept for the next
process (not with the cache off) and prefetched once.  Numba's warm-up after ``%load_ext``
and what registering an op costs: tests/test_fastloop_warmup.py."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from numba import cuda as numba_cuda

import pnex_magic as pnex
from pnex_magic import compiler
from pnex_magic.fingerprint import function_fingerprint
from pnex_magic.lazycuda import LazyCudaModule, is_lazy_cuda
from pnex_magic.lazycuda import cuda as lazy_cuda
from pnex_magic.spec import build_spec

from fastloop_helpers import run


# --------------------------------------------------------------------------- import


def test_import_imports_no_numba_and_prints_nothing(pnex_env):
    result = run(
        """
        import sys
        import torch
        import pnex_magic as pnex
        assert pnex.In and pnex.KernelDefinitionError
        heavy = [m for m in ("numba", "llvmlite", "torch.utils.cpp_extension", "torch._dynamo", "IPython",
                             "pnex_magic.report", "pnex_magic.artifact", "pnex_magic.op")
                 if m in sys.modules]
        print("HEAVY", heavy)
        pnex.jit, pnex.load, pnex.inspect, pnex.PnexOp, pnex.autograd  # the lazy names resolve
        print("LAZY-NUMBA", "numba" in sys.modules)
        """,
        pnex_env,
    )
    assert result.stderr == ""
    assert "HEAVY []" in result.stdout
    assert "LAZY-NUMBA False" in result.stdout  # not even jit's definition path imports it


def test_every_public_name_resolves():
    for name in pnex.__all__:
        assert getattr(pnex, name) is not None, name
    assert set(pnex.__all__) <= set(dir(pnex))
    from pnex_magic.op import PnexOp

    assert pnex.PnexOp is PnexOp


def test_the_cuda_headers_are_found_without_cpp_extension(pnex_env):
    """torch.utils.cpp_extension logs "No CUDA runtime is found" on a machine without a
    GPU when it is imported (CUDA build of torch): looking for headers must not import it."""
    result = run(
        """
        import sys
        import torch
        from pnex_magic.launch import build
        build.cuda_include_dirs(); build.cuda_home()
        print("CPP_EXTENSION", "torch.utils.cpp_extension" in sys.modules)
        """,
        pnex_env,
    )
    assert "CPP_EXTENSION False" in result.stdout
    assert result.stderr == ""


def test_cuda_home_agrees_with_torch(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as cpp_extension

    from pnex_magic.launch import build

    if not (torch.cuda._is_compiled() and torch.version.cuda):
        assert build.cuda_home() is None is cpp_extension.CUDA_HOME
        monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
        monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert build.cuda_home() == str(tmp_path)
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    nvcc = tmp_path / "toolkit" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(nvcc.parent))
    assert build.cuda_home() == str(tmp_path / "toolkit")


def test_the_demo_speaks_first(pnex_env):
    """``python -m pnex_magic``: its first line is pnex's report (read, then stopped)."""
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "pnex_magic"], env=pnex_env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    try:
        first = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert first.startswith("pnex kernel 'muladd'"), first


# --------------------------------------------------------------------------- cache hit, no compiler

_HIT_SCRIPT = """
import sys
import tempfile
import torch
import pnex_magic as pnex
from pnex_magic import cache

if sys.argv[1] == "forbid":
    # What Numba runs to compile: none of it may run on a cache hit.
    from numba import cuda
    import numba.cuda.compiler as ncompiler
    from numba.cuda import descriptor, target
    from numba.cuda.cudadrv import nvvm

    calls = []

    class CompilerRan(BaseException):  # not an Exception: nothing may swallow it
        pass

    def forbidden(name):
        def raiser(*args, **kwargs):
            calls.append(name)
            raise CompilerRan(name)
        return raiser

    for owner, name in ((cuda, "compile"), (cuda, "compile_ptx"), (cuda, "compile_all"),
                        (ncompiler, "compile"), (ncompiler, "compile_all"), (ncompiler, "compile_cuda"),
                        (ncompiler, "compile_extra"), (ncompiler, "compile_ptx")):
        setattr(owner, name, forbidden(f"{owner.__name__}.{name}"))
    target.CUDATypingContext.__init__ = forbidden("CUDATypingContext")
    target.CUDATargetContext.__init__ = forbidden("CUDATargetContext")
    descriptor.CUDATarget.typing_context = property(forbidden("CUDATarget.typing_context"))
    descriptor.CUDATarget.target_context = property(forbidden("CUDATarget.target_context"))
    nvvm.NVVM.__new__ = forbidden("NVVM")
    if len(sys.argv) > 2:
        from pnex_magic.lazycuda import cuda
else:
    from numba import cuda

LIMIT = 3.0

@pnex.jit(n_threads="a.numel()")
def hit_me(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = min(a[i] * LIMIT, 10.0)

a = torch.arange(5, dtype=torch.float32)
assert torch.equal(hit_me(a), torch.clamp(a * 3, max=10)), hit_me(a)
print("STATS", cache.stats.hits, cache.stats.misses, pnex.inspect(hit_me).cache_hit)
if sys.argv[1] == "forbid":
    print("CALLS", calls)
"""


def test_a_cache_hit_runs_no_part_of_numbas_compiler(tmp_path, pnex_env):
    script = tmp_path / "hit_script.py"
    script.write_text(_HIT_SCRIPT)
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"))

    def go(*args: str) -> str:
        result = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
        return result.stdout

    assert "STATS 0 1 False" in go("compile")
    out = go("forbid")
    assert "STATS 1 0 True" in out and "CALLS []" in out
    # %%pnex's lazy `cuda` in the kernel's globals: the same cache entry, no compiler
    out = go("forbid", "lazy")
    assert "STATS 1 0 True" in out and "CALLS []" in out


def test_a_cache_hit_without_numba_imported_defines_without_importing_it(tmp_path, pnex_env):
    """Definition on a hit (the GPU path, or a CPU op not yet called) imports no Numba."""
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"))
    code = """
        import sys
        import torch
        import pnex_magic as pnex
        from pnex_magic.lazycuda import cuda

        @pnex.jit(n_threads="a.numel()")
        def no_numba(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] + 7

        print("DEFINED", "numba" in sys.modules, pnex.inspect(no_numba).cache_hit)
        a = torch.arange(3, dtype=torch.float32)
        assert torch.equal(no_numba(a), a + 7)
        """
    path = tmp_path / "no_numba.py"
    path.write_text(textwrap.dedent(code))
    outs = []
    for _ in range(2):
        result = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        outs.append(result.stdout)
    assert "DEFINED True False" in outs[0]  # a miss compiles: Numba is imported then
    assert "DEFINED False True" in outs[1]


# --------------------------------------------------------------------------- the lazy cuda


_LAZY_SRC = """
from numba import float32

BLOCK = 32

@cuda.jit(device=True)
def twice(x):
    return x * 2 + cuda.threadIdx.x * 0

def lazy_kernel(a: pnex.In("f32", (None,)), hits: pnex.InMut("i32", (1,)), out: pnex.Out("f32", "a")):
    tile = cuda.shared.array(BLOCK, dtype=float32)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    if i < a.shape[0]:
        tile[t] = a[i]
    cuda.syncthreads()
    if i < a.shape[0]:
        out[i] = twice(tile[t]) + cuda.blockDim.x * 0
        cuda.atomic.add(hits, 0, 1)
"""


def _lazy_namespace(module) -> dict:
    import linecache

    ns = {"cuda": module, "pnex": pnex}
    # Its source where inspect finds it, as %%pnex registers a cell's: the simulator rewrites the kernel's source
    linecache.cache["<lazy-cuda-test>"] = (len(_LAZY_SRC), None, _LAZY_SRC.splitlines(True), "<lazy-cuda-test>")
    exec(compile(_LAZY_SRC, "<lazy-cuda-test>", "exec"), ns)
    return ns


def test_the_lazy_cuda_compiles_to_the_same_ptx_as_numba_cuda():
    ptx = []
    for module in (numba_cuda, lazy_cuda):
        fn = _lazy_namespace(module)["lazy_kernel"]
        spec = build_spec(fn, n_threads="a.numel()", threads_per_block=32)
        text, _ = compiler._numba_ptx(fn, spec, (7, 5), "C")
        # mangled names and the shared-memory symbol's counter differ between two compiles
        ptx.append(re.sub(r"_cudapy_smem_\d+", "SMEM", re.sub(r"_Z\w+", "SYM", text)))
    assert ptx[0] == ptx[1]


def test_the_lazy_cuda_fingerprints_as_the_module():
    fns = [_lazy_namespace(m)["lazy_kernel"] for m in (numba_cuda, lazy_cuda)]
    assert function_fingerprint(fns[0]) == function_fingerprint(fns[1])


def test_a_kernel_with_the_lazy_cuda_runs_in_the_simulator(fresh_cache):
    ns = _lazy_namespace(lazy_cuda)
    op = pnex.jit(n_threads="a.numel()", threads_per_block=32)(ns["lazy_kernel"])
    a = torch.arange(40, dtype=torch.float32)
    hits = torch.zeros(1, dtype=torch.int32)
    torch.testing.assert_close(op(a, hits), a * 2)
    assert hits.item() == 40
    assert is_lazy_cuda(ns["cuda"])  # the notebook's namespace keeps the stand-in


def test_the_lazy_cuda_forwards_and_stays_quiet_for_probes():
    assert lazy_cuda.grid is numba_cuda.grid
    assert "jit" in dir(lazy_cuda)
    for probe in ("_repr_html_", "__wrapped__", "_ipython_display_"):
        assert not hasattr(lazy_cuda, probe)
    assert "numba.cuda" in repr(lazy_cuda)
    import pickle

    assert pickle.loads(pickle.dumps(lazy_cuda)) is lazy_cuda
    assert isinstance(lazy_cuda, LazyCudaModule)


def test_the_cell_gets_the_lazy_cuda():
    from pnex_magic.frontends.cell import injected_names

    assert is_lazy_cuda(injected_names()["cuda"])


# --------------------------------------------------------------------------- frozen globals

SCALE = 2.0
TABLE = np.array([1.0, 2.0, 3.0], dtype=np.float32)


def make_with_device_function():
    @numba_cuda.jit(device=True)
    def scaled(x):
        return x * SCALE

    @pnex.jit(n_threads="a.numel()")
    def uses_device_function(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = numba_cuda.grid(1)
        if i < a.shape[0]:
            out[i] = scaled(a[i]) + TABLE[i % 3]

    return uses_device_function


def test_the_simulator_sees_device_functions_and_arrays_as_they_were_at_definition(fresh_cache, monkeypatch):
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "SCALE", 2.0)
    monkeypatch.setattr(this, "TABLE", np.array([1.0, 2.0, 3.0], dtype=np.float32))
    op = make_with_device_function()  # compiled (PTX) with these values
    monkeypatch.setattr(this, "SCALE", 5.0)  # a global the device function reads
    this.TABLE[:] = 100.0  # an array the kernel reads, changed in place: Numba baked its contents
    a = torch.arange(6, dtype=torch.float32)
    expected = a * 2 + torch.tensor([1.0, 2.0, 3.0, 1.0, 2.0, 3.0])
    torch.testing.assert_close(op(a), expected)  # the first simulated run comes after the change


# --------------------------------------------------------------------------- the SASS listing


def test_the_sass_listing_is_kept_for_the_next_process(fresh_cache, monkeypatch):
    from pnex_magic import sass

    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump or nvdisasm here")
    cubin = make_with_device_function().definition.compiled().cubin
    sass._disassemble_cached.cache_clear()
    first = sass.disassemble(cubin)
    assert first.text and first.tool
    sass._disassemble_cached.cache_clear()  # a new process: only the disk remains
    monkeypatch.setattr(sass, "_run_disassembler", lambda *a: pytest.fail("the disassembler ran again"))
    again = sass.disassemble(cubin)
    assert (again.text, again.tool) == (first.text, first.tool)
    sass._disassemble_cached.cache_clear()


def test_with_the_cache_off_the_sass_listing_is_neither_read_nor_kept(fresh_cache, monkeypatch):
    """The listing of a kernel whose options turn the cache off (``use_cache=False``, passed
    on by the report) is made by the disassembler and not stored; one stored for the same
    cubin is not read."""
    from pnex_magic import sass

    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump or nvdisasm here")
    cubin = make_with_device_function().definition.compiled().cubin
    sass._disassemble_cached.cache_clear()
    off = sass.disassemble(cubin, use_cache=False)
    assert off.text and not (fresh_cache / "sass").exists()
    sass._disassemble_cached.cache_clear()
    sass.disassemble(cubin)  # stored
    assert len(list((fresh_cache / "sass").glob("*.json"))) == 1
    sass._disassemble_cached.cache_clear()
    runs, real = [], sass._run_disassembler
    monkeypatch.setattr(sass, "_run_disassembler", lambda *a: runs.append(1) or real(*a))
    assert sass.disassemble(cubin, use_cache=False).text == off.text and runs == [1]
    sass._disassemble_cached.cache_clear()


def test_a_prefetched_sass_listing_is_made_once_in_the_background(fresh_cache, monkeypatch):
    """The magic starts the disassembler as soon as the kernel is compiled; the report's
    own call then waits for that run instead of starting a second one."""
    import threading

    from pnex_magic import sass

    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump or nvdisasm here")
    cubin = make_with_device_function().definition.compiled().cubin
    sass._disassemble_cached.cache_clear()
    runs, real = [], sass._run_disassembler

    def counted(*args):
        runs.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(sass, "_run_disassembler", counted)
    sass.prefetch(cubin)
    sass.prefetch(cubin)  # already running (or done): no second thread
    listing = sass.disassemble(cubin)
    assert listing.text and listing.tool
    assert runs == ["pnex-sass"]
    sass._disassemble_cached.cache_clear()
