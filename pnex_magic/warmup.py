"""Numba's one-time set-up, done in the background while the user types.

The first kernel a process compiles pays for more than itself: importing
``numba.cuda``, building its CUDA typing and target contexts (installing every
typing template and lowering registry), loading NVVM and libdevice, and nvJitLink.
That is about 1.5 s on two cores, against well under 0.1 s for each later kernel.
``%load_ext pnex_magic`` calls :func:`start`, which does all of it in a daemon
thread by compiling and linking a trivial kernel, so that the notebook's first
``%%pnex`` cell, typed a few seconds later, compiles at the later kernels' speed.
The front end hands in what else its first cell would pay for, run after Numba's
set-up in the same thread (the magic's: :mod:`pnex_magic.frontends.warm_tasks`).

It is invisible: the thread prints nothing, lets no exception out (a broken
compiler set-up is reported by the real compile, with its usual message) and does
not touch the process's warning filters (``warnings.catch_warnings`` is not
thread-safe).  It is not started by ``import pnex_magic``: a process that only
loads saved ops, or whose kernels are all in the cache, would pay for Numba for
nothing, and the thread would compete with the importing thread for the GIL.

pnex waits for it (:func:`wait`) before it calls Numba itself, so a compile never
runs beside it: a cell run at once simply finishes the same work in the
foreground.  ``PNEX_WARMUP=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from .linking import link_cubin

__all__ = ["start", "wait", "state"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_thread: threading.Thread | None = None
_state: dict[str, object] = {}
_tasks: tuple[Callable[[], object], ...] = ()


def start(*tasks: Callable[[], object]) -> threading.Thread | None:
    """Start the warm-up (once per process): Numba's set-up, then each of ``tasks``;
    returns its thread, or ``None`` when it is turned off (``PNEX_WARMUP=0``)."""
    global _thread, _tasks
    if os.environ.get("PNEX_WARMUP", "1") == "0":
        return None
    with _lock:
        if _thread is None:
            _tasks = tasks
            _thread = threading.Thread(target=_run, name="pnex-warmup", daemon=True)
            _thread.start()
        return _thread


def wait(timeout: float | None = None) -> None:
    """Block until the warm-up (if one was started) is done: called before pnex runs
    Numba's compiler, so that the two never overlap."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)


def state() -> dict[str, object]:
    """What the warm-up did: ``seconds`` when done, ``error`` if it failed (empty while
    it runs or when it never ran)."""
    return dict(_state)


def _run() -> None:
    begin = time.perf_counter()
    try:
        _warm()
    except BaseException as exc:  # never shown: the real compile reports a broken set-up
        _state["error"] = f"{type(exc).__name__}: {exc}"
        log.debug("pnex: the background warm-up of Numba failed: %s", _state["error"])
    _state["seconds"] = time.perf_counter() - begin


def _kernel_source():
    from numba import cuda

    def kernel(a, out):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * 2.0

    return kernel


def _warm() -> None:
    """Numba's set-up, then every task, each run whatever the others did; the first
    failure is raised at the end."""
    failed: BaseException | None = None
    for task in (_warm_numba, *_tasks):
        try:
            task()
        except BaseException as exc:  # noqa: BLE001 - kept for _run, which records it
            failed = failed or exc
    if failed is not None:
        raise failed


def _warm_numba() -> None:
    from numba import cuda
    from numba.cuda import types as nbtypes

    signature = (nbtypes.Array(nbtypes.float32, 1, "C", readonly=True), nbtypes.Array(nbtypes.float32, 1, "C"))
    ptx, _ = cuda.compile(_kernel_source(), signature, device=False, abi="numba", cc=(7, 5), output="ptx")
    link_cubin(ptx, "sm_75", None, "pnex_warmup", [])

