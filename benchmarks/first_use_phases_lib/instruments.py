"""The child's instruments in ``benchmarks/first_use_phases.py``: ``_Clock`` (exclusive wall time per
phase and thread), the hooks installed as pnex's and Numba's modules are imported
(``_AfterImport``), the garbage collections (``_Collections``), the kernel's source and a
long-lived heap."""

from __future__ import annotations

import gc
import importlib.abc
import sys
import threading
import time

from first_use_phases_lib.phases import HOOKS, _pass_phase


# ----------------------------------------------------------------------------- the child


class _Clock:
    """Exclusive wall time per phase and thread: the time between two events goes to the
    innermost phase open on that thread (``outside`` when none is)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.totals: dict[str, dict[str, float]] = {}  # thread role -> phase -> seconds

    def _state(self):
        st = self.local
        if not hasattr(st, "stack"):
            role = "main" if threading.current_thread() is threading.main_thread() else "background"
            st.stack, st.last, st.role = [], time.perf_counter(), role
        return st

    def _charge(self, st, now: float) -> None:
        phase = st.stack[-1] if st.stack else "outside"
        with self.lock:
            table = self.totals.setdefault(st.role, {})
            table[phase] = table.get(phase, 0.0) + now - st.last
        st.last = now

    def enter(self, phase: str) -> None:
        st = self._state()
        self._charge(st, time.perf_counter())
        st.stack.append(phase)

    def leave(self) -> None:
        st = self._state()
        self._charge(st, time.perf_counter())
        st.stack.pop()

    def take(self) -> dict[str, dict[str, float]]:
        """The totals so far (then zero), the open phases charged up to now."""
        st = self._state()
        self._charge(st, time.perf_counter())
        with self.lock:
            found, self.totals = self.totals, {}
        return found


def _wrap(clock: _Clock, fn, phase: str | None):
    import functools

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        clock.enter(phase if phase is not None else _pass_phase(args[2]))
        try:
            return fn(*args, **kwargs)
        finally:
            clock.leave()

    timed.__pnex_timed__ = True
    return timed


def _patch(clock: _Clock, module, path: str, phase: str | None) -> None:
    owner = module
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if fn is None or getattr(fn, "__pnex_timed__", False):
        return
    setattr(owner, name, _wrap(clock, fn, phase))
    if module.__name__ == "numba.cuda.compiler" and name == "compile":
        sys.modules["numba.cuda"].compile = getattr(owner, name)  # numba.cuda.compile is this function


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches each hooked module as soon as it has been executed (no import moves)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.pending: dict[str, list[tuple[str, str | None]]] = {}
        for module, path, phase in HOOKS:
            self.pending.setdefault(module, []).append((path, phase))

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = loader.exec_module
        hooks = self.pending[name]

        def exec_module(module):
            run(module)
            for attr, phase in hooks:
                _patch(self.clock, module, attr, phase)

        loader.exec_module = exec_module
        return spec

    def install(self) -> None:
        for name, hooks in self.pending.items():
            if name in sys.modules:
                for attr, phase in hooks:
                    _patch(self.clock, sys.modules[name], attr, phase)
        sys.meta_path.insert(0, self)


_KERNEL = '''
@pnex.jit(n_threads="a.numel()")
def {name}(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i] * {salt!r}
'''


class _Collections:
    """Python's garbage collections on the main thread: count and seconds per generation;
    each full (generation 2) collection also by the phase it came in (the innermost
    phase open on the main thread), with its seconds."""

    def __init__(self, clock: _Clock | None = None) -> None:
        self.started = 0.0
        self.clock = clock
        self.found: dict[int, list] = {}
        self.full: list[list] = []
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if phase == "start":
            self.started = time.perf_counter()
        else:
            seconds = time.perf_counter() - self.started
            entry = self.found.setdefault(info["generation"], [0, 0.0])
            entry[0] += 1
            entry[1] += seconds
            if info["generation"] == 2:  # also what it freed, and how many objects were frozen (the freeze
                # that pnex_magic.numbasetup holds over a first compile), taken after the timing
                stack = getattr(self.clock.local, "stack", None) if self.clock is not None else None
                self.full.append([stack[-1] if stack else "other", seconds, info.get("collected", 0),
                                  gc.get_freeze_count()])

    def take(self) -> dict[str, list]:
        found, self.found = self.found, {}
        return {str(g): v for g, v in sorted(found.items())}

    def take_full(self) -> list[list]:
        """The full collections since the last call: ``[phase, seconds, objects collected,
        objects frozen]`` each."""
        found, self.full = self.full, []
        return found


def _long_lived_heap(count: int) -> list:
    """``count`` objects the collector tracks and that live as long as the process (dicts
    holding a list each, as a large library's state does): a GPU host's heap imitated
    on CPU, where torch's CUDA state makes every full collection walk more objects."""
    return [{"i": [i]} for i in range(count // 2)]
