"""What pnex needs of Numba-CUDA's compiler driver wherever it types or compiles a
kernel: the compile stage (:mod:`pnex_magic.compiler`) and the CUDA simulator's typed
rewrite (:mod:`pnex_magic.simtyping`), which types kernels without compiling them.

* :func:`target_device`: Numba-CUDA compiles a kernel's device functions (and, while
  typing, the float16 operators) for the *current* device, which a machine without a
  GPU has none of; while pnex types or compiles, a stand-in is the current device.
* :func:`numba_error_line`: the line of the kernel a Numba typing error is about.

Nothing here imports Numba until it is called.
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["target_device", "numba_error_line"]


def numba_error_line(exc: BaseException, filename: str) -> int | None:
    """The line Numba was typing when it failed, read from the locations (``loc``)
    held by the frames of Numba's own exception.  Needed because numba-cuda 0.30 lets
    typing errors raised by Numba's core templates escape its type inference without
    a location (its ``except TypingError`` catches only numba-cuda's own class), so
    the message names no line."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 4:
        line = None
        tb = cause.__traceback__
        while tb is not None:
            for key in ("loc", "constraint", "inst", "stmt"):
                value = tb.tb_frame.f_locals.get(key)
                loc = value if key == "loc" else getattr(value, "loc", None)
                if getattr(loc, "filename", None) == filename and isinstance(getattr(loc, "line", None), int):
                    line = loc.line
            tb = tb.tb_next
        if line is not None:
            return line
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return None


class _TargetDevice:
    """Stands in for Numba's current device while pnex compiles for ``cc``."""

    def __init__(self, cc: tuple[int, int]):
        self.compute_capability = cc


_TARGET_LOCK = threading.RLock()


@contextlib.contextmanager
def target_device(cc: tuple[int, int]):
    """Numba-CUDA compiles a kernel's ``@cuda.jit(device=True)`` callees for the
    *current* device's compute capability, which needs a CUDA driver and may not be
    the architecture pnex targets.  While pnex compiles, the current device is the
    target.  The lock keeps concurrent compiles from restoring each other's stand-in."""
    from numba.cuda import dispatcher

    with _TARGET_LOCK:
        original = getattr(dispatcher, "get_current_device", None)
        if original is None:  # a numba-cuda that no longer looks it up there
            yield
            return
        dispatcher.get_current_device = lambda: _TargetDevice(cc)
        try:
            yield
        finally:
            dispatcher.get_current_device = original
