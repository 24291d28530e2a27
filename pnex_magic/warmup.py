"""Numba's one-time set-up, done in the background while the user types.

The first kernel a process compiles pays for more than itself: importing
``numba.cuda``, building its CUDA typing and target contexts (installing every
typing template and lowering registry: :mod:`pnex_magic.numbasetup`), loading NVVM,
libdevice and nvJitLink.  That is most of a second on two cores, against well under
0.1 s for each later kernel.  ``%load_ext pnex_magic`` calls :func:`start`, which does
it in a daemon thread, step by step: the import, the typing set-up, then what the
front end hands in (the magic's first-cell costs: :mod:`pnex_magic.frontends.warm_tasks`),
then a trivial kernel compiled and linked (the first compile's one-time costs in
lowering, NVVM and nvJitLink), so that the notebook's first ``%%pnex`` cell, typed a
few seconds later, compiles at the later kernels' speed.

It is invisible: the thread prints nothing, lets no exception out (a broken
compiler set-up is reported by the real compile, with its usual message) and does
not touch the process's warning filters (``warnings.catch_warnings`` is not
thread-safe).  It is not started by ``import pnex_magic``: a process that only
loads saved ops, or whose kernels are all in the cache, would pay for Numba for
nothing, and the thread would compete with the importing thread for the GIL
(a script's first kernel comes right after its imports: there is nothing to overlap).

pnex takes over from it (:func:`wait`) before it calls Numba itself, so a compile
never runs beside it: the warm-up finishes the step under way and does no more, and
the caller does what it still needs itself.  A cell run at once ("Run all") thus
waits for one step at most, never for work it does not need (the rest of the
warm-up's steps).  ``PNEX_WARMUP=0`` turns it off.

Every pnex call that may import Numba, CUDA Python or llvmlite on the caller's thread
takes over first (the compile and simulation stages, ``%pnex_doctor``, the lazy
``cuda`` of ``%%pnex`` cells, and the magic's hook before a cell that imports them):
two threads importing ``numba.cuda``'s modules deadlock on their module locks (the
package and ``numba.cuda.cudadrv`` import each other), and Python breaks the deadlock
by failing one of the imports, which leaves ``numba.cuda`` without its submodules'
attributes for the rest of the process (``tests/test_warmup_handover.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from . import numbasetup
from .linking import link_cubin

__all__ = ["start", "wait", "state"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()  # set by wait(): no step starts after it
_state: dict[str, object] = {}
_tasks: tuple[Callable[[], object], ...] = ()


def start(*tasks: Callable[[], object]) -> threading.Thread | None:
    """Start the warm-up (once per process): Numba's import and typing set-up, then each
    of ``tasks``, then a first compile; returns its thread, or ``None`` when it is turned
    off (``PNEX_WARMUP=0``)."""
    global _thread, _tasks, _stop
    if os.environ.get("PNEX_WARMUP", "1") == "0":
        return None
    with _lock:
        if _thread is None:
            _tasks = tasks
            _stop = threading.Event()
            _thread = threading.Thread(target=_run, name="pnex-warmup", daemon=True)
            _thread.start()
        return _thread


def wait(timeout: float | None = None) -> None:
    """Take over from the warm-up (if one was started): it finishes the step under way
    and starts no other; block until it has.  Called before pnex runs Numba, so that the
    two never overlap (nor two imports of Numba's modules); what the warm-up left undone,
    the caller's own compile does when it needs it."""
    with _lock:
        thread, stop = _thread, _stop
    if thread is not None and thread is not threading.current_thread():
        stop.set()
        thread.join(timeout)


def state() -> dict[str, object]:
    """What the warm-up did: ``seconds`` when done, ``steps`` (each step it ran, by name, and
    its seconds), ``skipped`` (the steps it left to the foreground: :func:`wait` came
    first), ``error`` if a step failed (empty while it runs or when it never ran)."""
    return {key: value.copy() if isinstance(value, (dict, list)) else value for key, value in list(_state.items())}


def _run() -> None:
    begin = time.perf_counter()
    try:
        _warm()
    except BaseException as exc:  # never shown: the real compile reports a broken set-up
        _state["error"] = f"{type(exc).__name__}: {exc}"
        log.debug("pnex: the background warm-up of Numba failed: %s", _state["error"])
    _state["seconds"] = time.perf_counter() - begin


def _steps() -> list[tuple[str, Callable[[], object]]]:
    """The steps, in order: what a first kernel needs most comes first."""
    return [("import numba.cuda", _import_numba), ("typing set-up", numbasetup.typing_setup),
            *((getattr(task, "__name__", repr(task)).strip("_"), task) for task in _tasks),
            ("first compile", _first_compile)]


def _warm() -> None:
    """Every step, each run whatever the others did, until :func:`wait` asks to stop; the
    first failure is raised at the end."""
    failed: BaseException | None = None
    done: dict[str, float] = {}
    skipped: list[str] = []
    _state.update(steps=done, skipped=skipped)
    stop = _stop
    for name, step in _steps():
        if stop.is_set():
            skipped.append(name)
            continue
        begin = time.perf_counter()
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - kept for _run, which records it
            failed = failed or exc
        done[name] = time.perf_counter() - begin
    if failed is not None:
        raise failed


def _import_numba() -> None:
    import numba.cuda  # noqa: F401


def _kernel_source():
    from numba import cuda

    def kernel(a, out):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * 2.0

    return kernel


def _first_compile() -> None:
    from numba import cuda
    from numba.cuda import types as nbtypes

    signature = (nbtypes.Array(nbtypes.float32, 1, "C", readonly=True), nbtypes.Array(nbtypes.float32, 1, "C"))
    with numbasetup.first_compile_frozen():  # as a foreground first compile (its full collections stall that too)
        ptx, _ = cuda.compile(_kernel_source(), signature, device=False, abi="numba", cc=(7, 5), output="ptx")
        link_cubin(ptx, "sm_75", None, "pnex_warmup", [])
    numbasetup.first_compile_ran()
