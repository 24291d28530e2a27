"""CUDA's report of a faulting kernel (an out-of-bounds access, say) arrives at a later
call, often outside pnex (``out.cpu()`` raising ``torch.AcceleratorError``).  The
launchers remember the pnex kernel launched last per device; these helpers recognise
such a report and say what to do.  ``PNEX_LAUNCH_BLOCKING=1`` or
``CUDA_LAUNCH_BLOCKING=1`` synchronise after every launch, so the kernel that faulted
is named at its launch."""

from __future__ import annotations

import os

__all__ = ["BLOCKING_ADVICE", "is_fault", "launch_blocking"]

_FAULTS = (
    "illegal memory access", "unspecified launch failure", "device-side assert", "illegal instruction",
    "misaligned address", "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
)

BLOCKING_ADVICE = (
    "Set PNEX_LAUNCH_BLOCKING=1 (or CUDA_LAUNCH_BLOCKING=1) before the process starts to have the kernel that "
    "faulted named at its launch. After a fault the GPU context is unusable: restart the Python process (the "
    "notebook's kernel)."
)


def is_fault(error: BaseException | str) -> bool:
    """Whether an error's text is CUDA's report of a faulting kernel."""
    text = str(error)
    return any(f in text for f in _FAULTS)


def launch_blocking() -> bool:
    """Synchronise after every launch (``PNEX_LAUNCH_BLOCKING=1`` or
    ``CUDA_LAUNCH_BLOCKING=1``), so a faulting kernel is reported by name."""
    return os.environ.get("PNEX_LAUNCH_BLOCKING", "0") == "1" or os.environ.get("CUDA_LAUNCH_BLOCKING", "0") == "1"
