"""First-use speed, kept as behaviour (issue 20): Numba's one-time set-up runs in the
background after ``%load_ext``, unseen, a compile racing it is correct, a cell naming Numba waits
for it and others do not, a failing warm-up stays silent, it loads a built launcher or starts its
build, and it can be turned off; a CPU call imports no dynamo, registering an op scans no modules,
and Numba is imported in the foreground only after the warm-up."""

from __future__ import annotations

import sys

import pytest
from numba import cuda as numba_cuda

import pnex_magic as pnex

from fastloop_helpers import run


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
