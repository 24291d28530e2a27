"""First-use speed, kept as behaviour (issue 20): ``import pnex_magic`` imports no
Numba and prints nothing; a compile-cache hit runs no part of Numba's compiler; the
``cuda`` that ``%%pnex`` cells get is ``numba.cuda`` imported on first use, and
compiles, fingerprints and simulates like the module; the simulator still sees the
globals a kernel read when it was defined; Numba's one-time set-up runs in the
background after ``%load_ext``, unseen, and a compile racing it is correct."""

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


def run(code: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, f"subprocess failed:\n{result.stdout}\n{result.stderr}"
    return result


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


# --------------------------------------------------------------------------- the warm-up


def test_load_ext_warms_numba_up_in_the_background_unseen(tmp_path, pnex_env):
    """%load_ext starts the warm-up (import pnex_magic does not); it says nothing, and a
    new kernel's compile afterwards finds Numba's contexts built."""
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="always")
    result = run(
        """
        import sys, threading, time
        import torch
        import pnex_magic
        assert not any(t.name == "pnex-warmup" for t in threading.enumerate()), "started by import"
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "pnex_magic")
        from pnex_magic import cache, warmup
        warmup._thread.join()  # all of it (wait() would take over after the step under way)
        assert "error" not in warmup.state() and warmup.state()["seconds"] > 0, warmup.state()
        assert warmup.state()["skipped"] == [], warmup.state()
        from numba.cuda.descriptor import cuda_target
        # Numba's one-time set-up, done by the warm-up: the CUDA typing and target contexts
        print("CONTEXTS", cuda_target._typingctx is not None, cuda_target._targetctx is not None)
        CELL = (
            'def after_warmup(a: In("f32", (None,)), out: Out("f32", "a")):\\n'
            '    i = cuda.grid(1)\\n'
            '    if i < a.shape[0]:\\n'
            '        out[i] = a[i] * 4\\n'
        )
        ip.run_cell_magic("pnex", "--n-threads a.numel()", CELL)
        [compiled] = ip.user_ns["after_warmup"].definition._compiled.values()
        print("COMPILE", compiled.compile_seconds, cache.stats.misses, warmup.state()["seconds"])
        """,
        env,
    )
    assert "Warning" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    # The cell's compile found Numba set up (what makes it a later kernel's compile; the
    # times are benchmarks/first_use.py's), and compiled: it was a new kernel.
    assert "CONTEXTS True True" in result.stdout, result.stdout
    seconds, misses, warmup_seconds = result.stdout.split("COMPILE ")[1].split()
    assert misses == "1" and float(seconds) > 0 and float(warmup_seconds) > 0


def test_a_compile_racing_the_warmup_is_correct(tmp_path, pnex_env):
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"))
    result = run(
        """
        import torch
        import pnex_magic as pnex
        from pnex_magic import warmup
        from pnex_magic.lazycuda import cuda
        warmup.start()

        @pnex.jit(n_threads="a.numel()")   # at once: while the warm-up imports and compiles
        def racer(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] - 1

        a = torch.arange(4, dtype=torch.float32)
        assert torch.equal(racer(a), a - 1)
        warmup.wait()
        print("STATE", sorted(warmup.state()), pnex.inspect(racer).cache_hit)
        """,
        env,
    )
    assert "STATE ['seconds', 'skipped', 'steps'] False" in result.stdout, result.stdout + result.stderr
    assert result.stderr == ""


def test_a_cell_naming_numba_waits_for_the_warmup_and_others_do_not(monkeypatch):
    """A cell that imports Numba itself runs after the warm-up, never beside it; a
    cell that does not name Numba runs at once; %unload_ext removes the hook."""
    import threading

    from IPython.testing.globalipapp import get_ipython

    from pnex_magic import warmup

    release = threading.Event()
    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setattr(warmup, "_warm", lambda: release.wait(30))  # a warm-up that runs until released
    ip = get_ipython()
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_line_magic("reload_ext", "pnex_magic")  # registered once, however often loaded
    try:
        assert warmup._thread is not None and warmup._thread.is_alive()
        ip.user_ns["_warm_alive"] = lambda: warmup._thread.is_alive()
        ip.run_cell("seen_plain = _warm_alive()")
        assert ip.user_ns["seen_plain"] is True  # ran beside the warm-up
        threading.Timer(0.3, release.set).start()
        ip.run_cell("seen_numba = _warm_alive()  # then: from numba import cuda")
        assert ip.user_ns["seen_numba"] is False  # waited for it
    finally:
        release.set()
        ip.run_line_magic("unload_ext", "pnex_magic")
    from pnex_magic.frontends.magic import _numba_cell_waits

    assert _numba_cell_waits not in ip.events.callbacks["pre_run_cell"]


def test_a_failing_warmup_stays_silent(monkeypatch, capfd):
    from pnex_magic import warmup

    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setattr(warmup, "_state", {})
    monkeypatch.setattr(warmup, "_warm", lambda: (_ for _ in ()).throw(RuntimeError("no NVVM here")))
    hooked = []
    monkeypatch.setattr("threading.excepthook", lambda args: hooked.append(args))
    thread = warmup.start()
    warmup.wait()
    assert not thread.is_alive()
    assert warmup.state()["error"] == "RuntimeError: no NVVM here"
    out, err = capfd.readouterr()
    assert (out, err, hooked) == ("", "", [])


def test_the_warmup_loads_a_built_launcher_or_starts_its_build_in_the_background(monkeypatch, tmp_path):
    """Where the C++ launcher is wanted, the warm-up imports it if it is built, else
    starts its build in a background process; it never builds in the foreground."""
    from pnex_magic.frontends import warm_tasks as warmup
    from pnex_magic.launch import background, build, native, switch

    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_targets", {})
    monkeypatch.setattr(switch, "_pending", {})
    monkeypatch.setattr(background, "build_now", lambda target: pytest.fail("built in the foreground"))
    started = []
    monkeypatch.setattr(background, "start", lambda target, **kw: started.append(target) or True)
    monkeypatch.setattr(native, "native_wanted", lambda: False)
    warmup._warm_launcher()
    assert started == []  # no CUDA: nothing to do
    monkeypatch.setattr(native, "native_wanted", lambda: True)
    monkeypatch.setattr(build, "cuda_headers", lambda what, crt=False: [str(tmp_path)])
    monkeypatch.setattr(build, "toolchain", lambda: {"compiler": "/usr/bin/c++", "compiler_mtime": 1, "ninja": "ninja"})
    imported = []
    monkeypatch.setattr(build, "import_built", lambda name, folder: imported.append(folder) or None)
    warmup._warm_launcher()
    [target] = started
    assert target.stem == "pnex_launcher" and imported == [target.folder]  # looked for a build first
    assert native._module is None and not any(tmp_path.rglob("*.so"))
    loaded = object()
    monkeypatch.setattr(build, "import_built", lambda name, folder: loaded)
    monkeypatch.setattr(native, "_loaded", lambda module: monkeypatch.setattr(native, "_module", module))
    warmup._warm_launcher()
    assert native._module is loaded and len(started) == 1  # built: imported, nothing started


def test_the_warmup_can_be_turned_off(monkeypatch):
    from pnex_magic import warmup

    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setenv("PNEX_WARMUP", "0")
    assert warmup.start() is None
    warmup.wait()  # nothing to wait for


# --------------------------------------------------------------------------- registration


def test_a_cpu_call_imports_no_dynamo_until_something_else_does(tmp_path, pnex_env):
    """torch's register_kernel wraps the implementation in torch._disable_dynamo, whose
    first call imports torch._dynamo (seconds on a CPU): pnex skips it until Dynamo is
    imported anyway, then calls go through torch's wrapper."""
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"))
    result = run(
        """
        import sys
        import torch
        import pnex_magic as pnex
        from numba import cuda

        @pnex.jit(n_threads="a.numel()")
        def no_dynamo(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] * 2

        a = torch.arange(5, dtype=torch.float32)
        assert torch.equal(no_dynamo(a), a * 2)
        print("DYNAMO", "torch._dynamo" in sys.modules)
        compiled = torch.compile(lambda x: no_dynamo(x) + 1, fullgraph=True, backend="eager")
        assert torch.equal(compiled(a), a * 2 + 1)
        assert torch.equal(no_dynamo(a), a * 2)  # eager again, now through torch's wrapper
        torch.library.opcheck(no_dynamo, (a,))
        print("OK")
        """,
        env,
        timeout=600,
    )
    assert "DYNAMO False" in result.stdout and "OK" in result.stdout


def test_registering_an_op_scans_no_modules(tmp_path, pnex_env):
    """torch names the line that registers a fake kernel through inspect, which scans
    every loaded module's file the first time (0.1-0.5 s with Numba loaded): pnex tells
    inspect where its own files are, so registering scans nothing."""
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"))
    result = run(
        """
        import inspect, sys
        import torch
        from numba import cuda
        import pnex_magic as pnex
        from pnex_magic import define, op

        def scanned(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i]

        d = define.definition(scanned, n_threads="a.numel()")
        d.check_compiles()
        calls = []
        original = inspect.getabsfile
        inspect.getabsfile = lambda *args, **kwargs: calls.append(args) or original(*args, **kwargs)
        with define.registered(d) as made:
            pass
        inspect.getabsfile = original
        print("GETABSFILE", len(calls), len(sys.modules), sum(m.startswith("pnex_magic") for m in sys.modules))
        with torch._subclasses.fake_tensor.FakeTensorMode():
            assert made(torch.empty(7)).shape == (7,)
        """,
        env,
    )
    calls, modules, own = map(int, result.stdout.split("GETABSFILE ")[1].split())
    # one lookup per pnex module (naming it), never a scan of every loaded module
    assert modules > 1000 and calls <= own + 5, (calls, modules, own)


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


def test_numba_is_imported_in_the_foreground_only_after_the_warmup(monkeypatch):
    """A cell run right after %load_ext whose kernel is a cache hit compiles nothing, but
    its simulated run imports Numba's simulator (and the lazy ``cuda`` numba.cuda): both
    wait for the background warm-up first, so the two imports never race."""
    from pnex_magic import definition as definition_module
    from pnex_magic import lazycuda, warmup

    waits = []
    monkeypatch.setattr(warmup, "wait", lambda timeout=None: waits.append(timeout))

    @pnex.jit(n_threads="a.numel()")
    def after_warm(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = numba_cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + 1

    waits.clear()
    after_warm.definition.simulated_function()
    assert waits, "simulated_function imported the simulator without waiting for the warm-up"
    monkeypatch.delitem(sys.modules, "numba.cuda")
    waits.clear()
    assert lazycuda.cuda.module() is not None and waits
    assert isinstance(after_warm.definition, definition_module.KernelDefinition)
