"""Which launches are checked (:mod:`pnex_magic.checking`): every launch of an op
defined with ``check=True`` (``%%pnex --check``, ``PNEX_CHECK=1``), and, on one
thread for a while, every launch of an op that :func:`checked_launches` names
(the ``%%pnex`` magic's first run of a new kernel on its ``--args``).

A checked launch runs the kernel's checked variant with an error record as its
last argument and reads the record after the launch (the launcher synchronises
the stream), so it cannot be captured in a CUDA graph; an access out of bounds
never happens and is raised as :class:`~pnex_magic.errors.KernelIndexError`, an
``IndexError`` naming the array, the index, the shape, the thread and block and
the line.

Every launcher imports this module (it sits at the bottom of the launch stage); a
launcher that decides in its own code which launches are checked (the C++ launcher)
follows :func:`checked_launches` through :func:`follow`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import KernelLaunchError

__all__ = ["wanted", "forced", "forced_name", "checked_launches", "follow", "capture_error", "RECORD_SLOTS"]

_local = threading.local()
_followers: list[Callable[[str], None]] = []

#: The error record's size in int64 entries (pnex_magic.checking.RECORD_SIZE, and the C++
#: launcher's kRecordSlots: tests/test_checked.py checks that they agree).
RECORD_SLOTS = 16


def forced(definition: Any) -> bool:
    """Whether ``definition``'s launches on this thread are checked for a while only
    (:func:`checked_launches`): the autotuner then runs the first candidate and keeps
    nothing, so that the fast variant is what it times later."""
    name = getattr(_local, "op_name", None)
    return name is not None and name == getattr(definition, "op_name", None) and not getattr(
        getattr(definition, "options", None), "check", False)


def wanted(definition: Any) -> bool:
    """Whether a launch of ``definition`` on this thread runs its checked variant."""
    if getattr(getattr(definition, "options", None), "check", False):
        return True
    name = getattr(_local, "op_name", None)
    return name is not None and name == getattr(definition, "op_name", None)


def forced_name() -> str:
    """The op whose launches :func:`checked_launches` checks on this thread ("": none)."""
    return getattr(_local, "op_name", None) or ""


def follow(callback: Callable[[str], None]) -> None:
    """Call ``callback(op_name)`` on the thread of :func:`checked_launches` whenever the op
    whose launches it checks there changes (``""``: none)."""
    if callback not in _followers:
        _followers.append(callback)


def _tell(op_name: str) -> None:
    for callback in _followers:
        callback(op_name)


@contextlib.contextmanager
def checked_launches(definition: Any) -> Iterator[None]:
    """Launches of ``definition``'s op on this thread, through any launcher, run its
    checked variant while the block runs."""
    previous = getattr(_local, "op_name", None)
    _local.op_name = definition.op_name
    _tell(definition.op_name)
    try:
        yield
    finally:
        _local.op_name = previous
        _tell(previous or "")


def capture_error(kernel: str) -> KernelLaunchError:
    return KernelLaunchError(
        f"kernel {kernel!r} runs checked launches (check=True, %%pnex --check or PNEX_CHECK=1), which read their "
        f"error record after every launch, so they cannot be captured in a CUDA graph; capture the op defined "
        f"without checks"
    )
