"""Numba-CUDA's one-time typing set-up, done by pnex before its first compile, and
cheaper than Numba does it.

The first kernel a process compiles makes Numba-CUDA build its typing and target
contexts: it imports every module that declares typing templates and lowerings
(NumPy's functions, the float16 and bfloat16 bindings, cffi, ...) and installs their
registries, about 145,000 Python objects that live as long as the process.  That is
most of a new kernel's first compile (0.5-0.8 s of 1.0 s on two shared cores,
``benchmarks/first_use_phases.py``); later kernels' refreshes find nothing new.

:func:`typing_setup` does this step as Numba's compiler would (the typing context's
refresh, then the target context's, under Numba-CUDA's global compiler lock and its
target override, so that nothing is installed in another order), with two
differences that change no compiled code:

* **No SciPy for the BLAS probe.**  Importing ``numba.cuda.np.arraymath`` probes for
  SciPy's BLAS (``_HAVE_BLAS``: whether ``np.correlate`` and ``np.convolve`` may call
  ``np.dot``).  Where SciPy is installed (JAX brings it) that imports
  ``scipy.linalg``, 0.15 s on two cores (with NumPy 2.4 SciPy's array-API layer
  imports ``numpy.f2py`` too), for nothing: Numba-CUDA has no ``np.dot`` for kernels,
  so the BLAS route cannot compile for a GPU.  While the set-up runs, on its own
  thread only, that probe (``numba.cuda.np.linalg.ensure_blas``, and nothing else)
  finds no SciPy; where ``scipy.linalg`` is imported already it is left to find it.
* **The collector walks only the new objects.**  The set-up's new objects trigger
  one full collection of Python's cyclic garbage collector, which would also walk
  every object torch and the program made before (0.15 s on two cores).  During the
  set-up those older objects are frozen (:func:`pnex_magic.collector.older_objects_frozen`,
  whose notes say what is frozen and unfrozen, and when), so that it walks the new
  ones only (0.03 s).  The same freeze covers the rest of the process's first compile and
  definition (:func:`first_compile_frozen`: the kernel's typing, lowering, the link,
  the cache's store, the op's registration), whose allocations trigger more full
  collections.

Thread safety: the set-up holds Numba-CUDA's global compiler lock (with upstream
Numba's, where it is installed), which every Numba compile holds while it refreshes
the same contexts, so no compile on another thread reads the registries half
installed; it refreshes in the order Numba's compiler does, so templates are
installed in the same order (the same overloads chosen).  Registrations made meanwhile
on another thread are installed by the next refresh, as in Numba.

Both ``%load_ext``'s background warm-up (:mod:`pnex_magic.warmup`) and the compile
stage (:mod:`pnex_magic.compiler`) call it; it runs once per process (later calls
return at once) and reports what it did in :func:`state`.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from . import collector

__all__ = ["typing_setup", "state", "first_compile_frozen", "first_compile_ran"]

_state: dict[str, Any] = {}
#: Numba-CUDA's function that probes for SciPy's BLAS: its name, and its module's.
_BLAS_PROBE = ("ensure_blas", "numba.cuda.np.linalg")


def state() -> dict[str, Any]:
    """What :func:`typing_setup` did: ``seconds``, the ``thread`` it ran on, the SciPy
    modules the BLAS probe was refused (``scipy_refused``) and whether older objects
    were frozen (``frozen``); empty before it has run."""
    return dict(_state)


def typing_setup() -> None:
    """Numba-CUDA's typing and target contexts with every registry installed (once per
    process; thread-safe: under Numba-CUDA's global compiler lock, which every Numba
    compile holds too)."""
    if _state:
        return
    from numba.cuda.core.compiler_lock import global_compiler_lock
    from numba.cuda.descriptor import cuda_target

    with global_compiler_lock:
        if _state:
            return
        begin = time.perf_counter()
        with _blas_probe_without_scipy() as refused, _older_objects_frozen() as frozen, _target_override():
            cuda_target.typing_context.refresh()  # as numba.cuda.core.compiler.CompilerBase does, in its order
            cuda_target.target_context.refresh()
        _state.update(seconds=time.perf_counter() - begin, thread=threading.current_thread().name,
                      scipy_refused=list(refused), frozen=frozen)


def _target_override() -> Any:
    """Numba-CUDA's ``numba_target_override`` (the CUDA target for upstream Numba's
    registries while it compiles), where this numba-cuda has it."""
    from numba.cuda import utils

    override = getattr(utils, "numba_target_override", None)
    return override() if override is not None else contextlib.nullcontext()


class _RefuseScipyToBlasProbe(importlib.abc.MetaPathFinder):
    """Refuses ``scipy`` and its submodules to Numba-CUDA's BLAS probe on one thread."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.refused: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if threading.get_ident() != self.thread or name.partition(".")[0] != "scipy":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if (frame.f_code.co_name, frame.f_globals.get("__name__")) == _BLAS_PROBE:
                self.refused.append(name)
                raise ModuleNotFoundError(
                    f"pnex: {name} is not imported for Numba-CUDA's BLAS probe (kernels cannot call BLAS; "
                    f"see pnex_magic.numbasetup)", name=name,
                )
            frame = frame.f_back
        return None


@contextlib.contextmanager
def _blas_probe_without_scipy() -> Iterator[list[str]]:
    if "scipy.linalg" in sys.modules:  # imported already: the probe costs nothing
        yield []
        return
    finder = _RefuseScipyToBlasProbe()
    sys.meta_path.insert(0, finder)
    try:
        yield finder.refused
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


# (a name of this module's, so that benchmarks/first_use_phases.py can leave the collector alone)
_older_objects_frozen = collector.older_objects_frozen
_first_compile_ran = False


@contextlib.contextmanager
def first_compile_frozen() -> Iterator[bool]:
    """Older objects frozen (as during :func:`typing_setup`) until this process's first
    compile has ended (:func:`first_compile_ran`): a first kernel's definition leaves
    some 110,000 more objects tracked by the collector (Numba's registries, its
    lowering's and pnex's compile path's state; measured on CPU), whose allocations
    trigger full collections that would each walk every older object (torch's CUDA
    state, on a GPU host).  Later blocks do nothing: a later kernel made no full
    collection in any round of ``benchmarks/first_use_phases.py`` (H100 and CPU)."""
    if _first_compile_ran:
        yield False
        return
    with _older_objects_frozen() as frozen:
        yield frozen


def first_compile_ran() -> None:
    """A compile (Numba's, then the link) has ended: :func:`first_compile_frozen` does
    nothing from now on."""
    global _first_compile_ran
    _first_compile_ran = True
