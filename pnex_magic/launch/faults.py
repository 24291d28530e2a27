"""CUDA's report of a faulting kernel (an out-of-bounds access, say) arrives at a later
call, often outside pnex (``out.cpu()`` raising ``torch.AcceleratorError``).  The
launchers remember the pnex kernel launched last per device; these helpers recognise
such a report and say what to do: :func:`fault_sentence` says in one sentence that
the CUDA context is lost, which pnex kernel ran last, and that a checked launch
(``%%pnex --check``, ``jit(check=True)``, ``PNEX_CHECK=1``) or ``%%pnex --sanitize``
finds the line at fault.  ``PNEX_LAUNCH_BLOCKING=1`` or ``CUDA_LAUNCH_BLOCKING=1``
synchronise after every launch, so the kernel that faulted is named at its launch."""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["BLOCKING_ADVICE", "BLOCKING_HINT", "CHECK_HINT", "fault_sentence", "is_fault", "launch_blocking"]

_FAULTS = (
    "illegal memory access", "unspecified launch failure", "device-side assert", "illegal instruction",
    "misaligned address", "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
)

#: How to find the line at fault (a clause, for the sentences below).
CHECK_HINT = (
    "`%%pnex --check` or `%%pnex --sanitize` on the kernel's cell (outside a notebook, `jit(check=True)` or "
    "PNEX_CHECK=1) finds the line at fault"
)

#: How to have the faulting kernel named at its launch (a sentence).
BLOCKING_HINT = (
    "Set PNEX_LAUNCH_BLOCKING=1 (or CUDA_LAUNCH_BLOCKING=1) before the process starts to have the kernel that "
    "faulted named at its launch."
)

#: All of it, where the kernel is named elsewhere in the message.
BLOCKING_ADVICE = (
    f"{BLOCKING_HINT} After a fault the CUDA context is lost: restart the Python process (the notebook's "
    f"kernel); {CHECK_HINT}."
)


def fault_sentence(kernels: str | Iterable[str]) -> str:
    """One sentence for a kernel fault: the CUDA context is lost, the pnex kernel(s)
    launched last (``"'k' on cuda:0"``, or a bare name, which is quoted), and that
    ``%%pnex --check`` or ``--sanitize`` finds the line ("" when no pnex kernel ran:
    the fault is not pnex's to explain), followed by :data:`BLOCKING_HINT`.

    >>> fault_sentence("'bad_k' on cuda:1")[:60]
    'The CUDA context is lost after a kernel fault (restart the P'
    """
    names = [kernels] if isinstance(kernels, str) else list(kernels)
    names = [n if "'" in n else f"'{n}'" for n in names if n]
    if not names:
        return ""
    ran = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    were = "was" if len(names) == 1 else "were"
    return (
        f"The CUDA context is lost after a kernel fault (restart the Python process, the notebook's kernel, to use "
        f"the GPU again); the last pnex kernel launched {were} {ran}, and {CHECK_HINT}. {BLOCKING_HINT}"
    )


def is_fault(error: BaseException | str) -> bool:
    """Whether an error's text is CUDA's report of a faulting kernel."""
    text = str(error)
    return any(f in text for f in _FAULTS)


def launch_blocking() -> bool:
    """Synchronise after every launch (``PNEX_LAUNCH_BLOCKING=1`` or
    ``CUDA_LAUNCH_BLOCKING=1``), so a faulting kernel is reported by name."""
    return os.environ.get("PNEX_LAUNCH_BLOCKING", "0") == "1" or os.environ.get("CUDA_LAUNCH_BLOCKING", "0") == "1"
