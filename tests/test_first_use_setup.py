"""A new kernel's first compile, made cheaper (issue 37), changes nothing it compiles.

:mod:`pnex_magic.numbasetup` does Numba-CUDA's typing set-up itself, without SciPy for
Numba's BLAS probe and with the collector walking only the set-up's new objects;
:mod:`pnex_magic.warmup` runs it in the background after ``%load_ext`` and hands over
after the step under way when the foreground needs Numba.  Here: the same PTX whichever
way the set-up ran (pnex's, Numba's own, the background warm-up's, each checked to have
run as said), the BLAS probe alone is refused SciPy, the collector's frozen objects are
unfrozen, and a foreground call that takes over from the warm-up waits for one step and
no more.  The times are ``benchmarks/first_use_phases.py``'s and ``benchmarks/first_use.py``'s.
"""

from __future__ import annotations

import gc
import importlib.util
import re
import subprocess
import sys
import threading
import time
import types
import weakref

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import collector, numbasetup, warmup

HAS_SCIPY = importlib.util.find_spec("scipy") is not None

# Kernels that reach many registries: math and float64, float16 operators (linked helpers),
# shared memory and atomics, and pnex's own Numba extension (vload/vstore).
KERNELS = '''
import json, math, sys, hashlib
import torch
import pnex_magic as pnex
from numba import cuda, float32

route = sys.argv[1]
if route == "numba":  # Numba's own set-up, inside the first cuda.compile
    from pnex_magic import numbasetup
    numbasetup.typing_setup = lambda: None
elif route == "warmup":  # the background warm-up, run to its end before the first compile
    from pnex_magic import warmup
    warmup.start()
    warmup._thread.join()

@pnex.jit(n_threads="a.numel()", arch="sm_80")
def k_math(a: pnex.In("f32", (None,)), b: pnex.In("f64", "a"), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = math.exp(-a[i]) + float32(math.sqrt(abs(b[i]))) + math.sin(a[i]) * a[i] ** 2

@pnex.jit(n_threads="a.numel()", arch="sm_80")
def k_half(a: pnex.In("f16", (None,)), out: pnex.Out("f16", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * a[i] + a[i]

@pnex.jit(n_threads="a.numel()", arch="sm_80")
def k_shared(a: pnex.In("f32", (None,)), out: pnex.InMut("f32", (1,))):
    s = cuda.shared.array(256, float32)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    s[t] = a[i] if i < a.shape[0] else 0.0
    cuda.syncthreads()
    if t == 0:
        acc = 0.0
        for j in range(256):
            acc += s[j]
        cuda.atomic.add(out, 0, acc)

@pnex.jit(n_threads="a.numel() // 4", arch="sm_80")
def k_vec(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i * 4 < a.shape[0]:
        v = pnex.vload(a, i * 4, 4)
        pnex.vstore(out, i * 4, (v[0] + 1, v[1] * 2, v[2], v[3]))

from pnex_magic import cache, numbasetup, warmup
import gc as _gc
found = {op._pnex.spec.name: op._pnex.compiled().ptx for op in (k_math, k_half, k_shared, k_vec)}
print("RESULT " + json.dumps({
    "ptx": found, "misses": cache.stats.misses, "setup": numbasetup.state(), "warmup": warmup.state(),
    "have_blas": sys.modules["numba.cuda.np.arraymath"]._HAVE_BLAS, "scipy_linalg": "scipy.linalg" in sys.modules,
    "frozen_after": _gc.get_freeze_count(), "gc_enabled": _gc.isenabled(),
    "first_compile_ran": numbasetup._first_compile_ran,
}))
'''


def _compile_in_a_fresh_process(route: str, tmp_path, pnex_env) -> dict:
    import json

    script = tmp_path / "kernels.py"  # a file: the kernels' source is readable
    script.write_text(KERNELS)
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / f"cache-{route}"))
    done = subprocess.run([sys.executable, str(script), route], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "RESULT " in done.stdout, done.stdout + done.stderr
    return json.loads(done.stdout.split("RESULT ", 1)[1])


def _canonical(ptx: str, unique_ids: bool = True) -> tuple[list[str], list[str]]:
    """The PTX's top-level declarations (``.extern .func``, ``.common .global``: Numba emits
    them in an order that varies from process to process, whatever the route, from
    orderings by object identity), sorted, and every other line in its order.  Without
    ``unique_ids``: Numba's mangled names carry a per-process counter of the functions it
    compiled (``B2v7``), which the warm-up's own kernel moves along: they are replaced,
    and the debug sections' bytes (``.b8`` lines, which spell those names) left out."""
    if not unique_ids:
        ptx = re.sub(r"B\d+v\d+B", "BvB", ptx)
        ptx = "\n".join(line for line in ptx.splitlines() if not line.startswith(".b8 "))
    declarations, body, current = [], [], None
    for line in ptx.splitlines():
        if current is None and line.startswith((".extern", ".common")):
            current = []
        if current is None:
            body.append(line)
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            declarations.append("\n".join(current))
            current = None
    return sorted(declarations), body


def test_every_route_of_the_typing_setup_compiles_the_same_code(tmp_path, pnex_env):
    pnex_route = _compile_in_a_fresh_process("pnex", tmp_path, pnex_env)
    numba_route = _compile_in_a_fresh_process("numba", tmp_path, pnex_env)
    warm_route = _compile_in_a_fresh_process("warmup", tmp_path, pnex_env)
    # Each process went the way it says (else the comparison below proves nothing):
    assert pnex_route["misses"] == numba_route["misses"] == warm_route["misses"] == 4
    assert pnex_route["setup"]["thread"] == "MainThread" and pnex_route["setup"]["frozen"] is True
    assert numba_route["setup"] == {}  # Numba's compile did the set-up, as without pnex's
    assert warm_route["setup"]["thread"] == "pnex-warmup"  # done in the background, before the compile
    assert warm_route["warmup"]["skipped"] == [] and "error" not in warm_route["warmup"], warm_route["warmup"]
    assert {"import numba.cuda", "typing set-up", "first compile"} <= set(warm_route["warmup"]["steps"])
    if HAS_SCIPY:  # pnex's set-up kept SciPy out; Numba's own imported it for the probe
        assert pnex_route["setup"]["scipy_refused"] and not pnex_route["scipy_linalg"]
        assert pnex_route["have_blas"] is False and numba_route["have_blas"] is True and numba_route["scipy_linalg"]
    assert pnex_route["frozen_after"] == warm_route["frozen_after"] == 0  # the first compile's freeze: ended
    assert pnex_route["gc_enabled"] and warm_route["gc_enabled"] and pnex_route["first_compile_ran"]
    # The same code (the warm-up's: but for Numba's unique ids), declarations in any order.
    assert {k: _canonical(v) for k, v in pnex_route["ptx"].items()} == {
        k: _canonical(v) for k, v in numba_route["ptx"].items()}
    assert {k: _canonical(v, unique_ids=False) for k, v in warm_route["ptx"].items()} == {
        k: _canonical(v, unique_ids=False) for k, v in pnex_route["ptx"].items()}
    assert all(".entry" in ptx for ptx in pnex_route["ptx"].values())
    assert len(_canonical(pnex_route["ptx"]["k_half"])[0]) >= 2  # the float16 operators' declarations


# --------------------------------------------------------------------------- the BLAS probe


def _as_the_blas_probe(call):
    """``call()`` run from a function named and placed as Numba-CUDA's BLAS probe."""
    namespace = {"__name__": numbasetup._BLAS_PROBE[1], "call": call}
    exec(compile(f"def {numbasetup._BLAS_PROBE[0]}():\n    return call()\n", "<probe>", "exec"), namespace)
    return namespace[numbasetup._BLAS_PROBE[0]]()


def test_only_the_blas_probe_on_the_setup_thread_is_refused_scipy():
    finder = numbasetup._RefuseScipyToBlasProbe()
    with pytest.raises(ModuleNotFoundError, match="BLAS probe"):
        _as_the_blas_probe(lambda: finder.find_spec("scipy"))
    with pytest.raises(ModuleNotFoundError):
        _as_the_blas_probe(lambda: finder.find_spec("scipy.linalg"))
    assert finder.refused == ["scipy", "scipy.linalg"]
    assert _as_the_blas_probe(lambda: finder.find_spec("numpy")) is None  # other modules: not its business
    assert finder.find_spec("scipy") is None  # the same thread, not in the probe
    other: list = []
    thread = threading.Thread(target=lambda: other.append(_as_the_blas_probe(lambda: finder.find_spec("scipy"))))
    thread.start()
    thread.join()
    assert other == [None]  # another thread, even in a function of that name
    assert finder.refused == ["scipy", "scipy.linalg"]


def test_the_probe_finder_is_in_place_only_during_the_setup(monkeypatch):
    mine = lambda: [f for f in sys.meta_path if isinstance(f, numbasetup._RefuseScipyToBlasProbe)]  # noqa: E731
    monkeypatch.delitem(sys.modules, "scipy.linalg", raising=False)
    with numbasetup._blas_probe_without_scipy():
        assert len(mine()) == 1
    assert mine() == []
    with pytest.raises(RuntimeError), numbasetup._blas_probe_without_scipy():
        raise RuntimeError("the set-up failed")
    assert mine() == []
    monkeypatch.setitem(sys.modules, "scipy.linalg", types.ModuleType("scipy.linalg"))
    with numbasetup._blas_probe_without_scipy() as refused:  # imported already: nothing to spare
        assert mine() == [] and refused == []


# --------------------------------------------------------------------------- the collector
# (pnex_magic.collector's own rules: tests/test_collector.py)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def _cycle() -> weakref.ref:
    """A weak reference to garbage that only the cyclic collector frees."""
    return weakref.ref(_Node())


@pytest.fixture
def first_compile(monkeypatch, python_frozen):
    """This process's first compile still to come (as in a fresh process)."""
    assert gc.get_freeze_count() <= python_frozen and gc.isenabled()
    monkeypatch.setattr(numbasetup, "_first_compile_ran", False)
    yield
    assert collector.holders() == 0 and gc.get_freeze_count() <= python_frozen


def test_the_first_compile_freezes_older_objects_and_later_ones_do_not(first_compile, python_frozen):
    old = _cycle()
    with numbasetup.first_compile_frozen() as frozen:
        assert frozen is True and gc.get_freeze_count() > python_frozen
        gc.collect()
        assert old() is not None  # frozen: not walked during the first compile
        new = _cycle()
        gc.collect()
        assert new() is None  # the compile's own garbage: collected as ever
        during = _cycle()
    assert gc.get_freeze_count() <= python_frozen and gc.isenabled()
    gc.collect()
    assert old() is None and during() is None  # nothing left uncollected
    numbasetup.first_compile_ran()
    with numbasetup.first_compile_frozen() as frozen:
        assert frozen is False and gc.get_freeze_count() <= python_frozen


def test_the_first_compile_leaves_a_disabled_collector_alone_and_freezes_over_a_freeze(first_compile, python_frozen):
    gc.disable()
    try:
        with numbasetup.first_compile_frozen() as frozen:
            assert frozen is False and gc.get_freeze_count() <= python_frozen
    finally:
        gc.enable()
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with numbasetup.first_compile_frozen() as frozen, collector.older_objects_frozen() as inner:
            assert frozen is True and inner is True and gc.get_freeze_count() > count  # one freeze, shared
        assert gc.get_freeze_count() <= python_frozen
    finally:
        gc.unfreeze()


def test_overlapping_freezes_share_one_released_by_the_last(first_compile, python_frozen):
    """The warm-up's set-up (another thread) and a foreground compile overlap, in either
    order of ending: one freeze, released when both have ended."""
    for warmup_ends_first in (True, False):
        entered, release, seen = threading.Event(), threading.Event(), []

        def warm():
            with collector.older_objects_frozen() as frozen:
                seen.append(frozen)
                entered.set()
                release.wait(30)

        thread = threading.Thread(target=warm)
        thread.start()
        assert entered.wait(30)
        with numbasetup.first_compile_frozen() as frozen:
            assert frozen is True and seen == [True] and gc.get_freeze_count() > python_frozen
            if warmup_ends_first:
                release.set()
                thread.join(30)
                assert gc.get_freeze_count() > python_frozen  # the compile still holds it
        if warmup_ends_first:
            assert gc.get_freeze_count() <= python_frozen
        else:
            assert gc.get_freeze_count() > python_frozen  # the warm-up still holds it
        release.set()
        thread.join(30)
        assert gc.get_freeze_count() <= python_frozen and collector.holders() == 0


def test_a_first_compile_beside_the_warmup_leaves_the_collector_as_it_was(first_compile, fake_steps, monkeypatch,
                                                                           python_frozen):
    """A real compile on a cache miss, while the warm-up's step (a freeze, as its typing
    set-up's) runs: the compile's code sees older objects frozen, garbage made before and
    during it is collected after it, and the freeze count is back to what Python keeps frozen by itself."""
    from pnex_magic import compiler

    def frozen_step():
        with collector.older_objects_frozen():
            fake_steps.started.set()
            fake_steps.release.wait(30)

    monkeypatch.setattr(warmup, "_steps", lambda: [("typing set-up", frozen_step)])
    during: list = []
    compile_new = compiler._compile_new

    def watched(*args, **kwargs):
        during.append((gc.get_freeze_count(), _cycle()))
        return compile_new(*args, **kwargs)

    monkeypatch.setattr(compiler, "_compile_new", watched)
    thread = warmup.start()
    assert fake_steps.started.wait(30)
    threading.Timer(0.2, fake_steps.release.set).start()  # the step ends while the compile waits for it
    old = _cycle()
    scale = 1.0 + time.time_ns() % 1_000_000 / 1e7  # a new kernel: a cache miss

    @pnex.jit(n_threads="a.numel()")
    def scaled(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * scale

    thread.join(30)
    assert len(during) == 1 and during[0][0] > python_frozen  # compiled with older objects frozen
    assert scaled._pnex.compiled_if_available().cache_hit is False and numbasetup._first_compile_ran
    assert gc.get_freeze_count() <= python_frozen and gc.isenabled()
    gc.collect()
    assert old() is None and during[0][1]() is None
    a = torch.randn(33)
    torch.testing.assert_close(scaled(a), a * scale)


# --------------------------------------------------------------------------- the warm-up hands over


@pytest.fixture
def fake_steps(monkeypatch):
    """The warm-up with three recorded steps instead of Numba's; the first runs until
    ``release`` is set."""
    started, release, ran = threading.Event(), threading.Event(), []

    def first():
        ran.append(("first", "start", time.perf_counter()))
        started.set()
        release.wait(30)
        ran.append(("first", "end", time.perf_counter()))

    steps = [("first", first), ("second", lambda: ran.append(("second",))), ("third", lambda: ran.append(("third",)))]
    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setattr(warmup, "_state", {})
    monkeypatch.setattr(warmup, "_stop", warmup._stop)  # start() makes a new one: the old one comes back
    monkeypatch.setattr(warmup, "_tasks", warmup._tasks)
    monkeypatch.setattr(warmup, "_steps", lambda: steps)
    monkeypatch.delenv("PNEX_WARMUP", raising=False)
    yield types.SimpleNamespace(started=started, release=release, ran=ran)
    release.set()


def test_a_foreground_call_waits_for_the_step_under_way_and_no_more(fake_steps):
    thread = warmup.start()
    assert fake_steps.started.wait(30)
    returned: list[float] = []
    taker = threading.Thread(target=lambda: (warmup.wait(), returned.append(time.perf_counter())))
    taker.start()
    time.sleep(0.2)
    assert returned == []  # the step under way is not cut short
    fake_steps.release.set()
    taker.join(30)
    assert not thread.is_alive()
    assert [r[:2] for r in fake_steps.ran] == [("first", "start"), ("first", "end")]  # the rest: not run
    assert returned[0] >= fake_steps.ran[1][2]  # and wait() returned after the step ended
    state = warmup.state()
    assert list(state["steps"]) == ["first"] and state["skipped"] == ["second", "third"] and "error" not in state


def test_left_alone_the_warmup_runs_every_step(fake_steps):
    thread = warmup.start()
    fake_steps.release.set()
    thread.join(30)
    assert [r[0] for r in fake_steps.ran] == ["first", "first", "second", "third"]
    assert list(warmup.state()["steps"]) == ["first", "second", "third"] and warmup.state()["skipped"] == []


def test_the_steps_put_what_a_first_kernel_needs_first():
    names = [name for name, _ in warmup._steps()]
    assert names[:2] == ["import numba.cuda", "typing set-up"] and names[-1] == "first compile"
    assert dict(warmup._steps())["typing set-up"] is numbasetup.typing_setup


def test_a_step_that_fails_is_recorded_and_the_others_still_run(fake_steps, monkeypatch):
    def broken():
        raise RuntimeError("no NVVM here")

    steps = [("broken", broken), ("after", lambda: fake_steps.ran.append(("after",)))]
    monkeypatch.setattr(warmup, "_steps", lambda: steps)
    warmup.start().join(30)
    assert fake_steps.ran == [("after",)]
    assert warmup.state()["error"] == "RuntimeError: no NVVM here"

