"""Hidden arguments: the device arrays a kernel reads as globals (or closure
variables), which every launcher passes after the kernel's own parameters (and after
a checked launch's error record), as the same object at every launch
(:mod:`pnex_magic.snapshot`).  What a launcher checks of them per launch: the device
(the call's), and the dtype, rank and layout the code was compiled for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..errors import ArgumentTypeError, KernelLaunchError

__all__ = ["hidden_arrays", "hidden_tensors", "describe_tensor"]


def hidden_arrays(definition: Any) -> tuple[Any, ...]:
    """The kernel's :class:`~pnex_magic.snapshot.HiddenArray` records (none for a
    kernel loaded from a saved artifact)."""
    return tuple(getattr(definition, "hidden_arrays", ()))


def describe_tensor(t: torch.Tensor) -> str:
    layout = "contiguous" if t.is_contiguous() else "strided"
    return f"{str(t.dtype).removeprefix('torch.')}, {t.dim()}-D, {layout}"


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device
    return (a.index if a.index is not None else current()) == (b.index if b.index is not None else current())


def hidden_tensors(definition: Any, device: torch.device) -> Iterator[tuple[Any, torch.Tensor]]:
    """Each hidden array with its tensor, checked for a launch on ``device``.

    Raises
    ------
    ArgumentTypeError
        A hidden array is not on ``device`` (pnex never copies it).
    KernelLaunchError
        Its dtype, rank or layout changed since the kernel was defined (its code takes
        the former).
    """
    kernel = definition.spec.name
    for h in hidden_arrays(definition):
        if device.type != "cuda" and not isinstance(h.obj, torch.Tensor):
            raise _device_error(kernel, h.name, f"a device array ({type(h.obj).__name__}) on the GPU", device)
        t = h.tensor()
        if not _same_device(t.device, device):
            raise _device_error(kernel, h.name, f"a tensor on {t.device}", device)
        if t.dtype != h.dtype.torch or t.dim() != h.ndim or (h.contiguous and not t.is_contiguous()):
            raise KernelLaunchError(
                f"{kernel}(): the kernel reads the global {h.name!r}, which was a {h.describe()} array when the "
                f"kernel was defined and is now {describe_tensor(t)}; its code was compiled for the former. "
                f"Define the kernel again (re-run its definition)"
            )
        yield h, t


def _device_error(kernel: str, name: str, what: str, device: torch.device) -> ArgumentTypeError:
    return ArgumentTypeError(
        f"{kernel}(): the kernel reads the global {name!r}, {what}, but this call's tensors are on {device}; "
        f"pnex passes such a global to the kernel as it is (a hidden argument, never copied). Keep it on the "
        f"device of the calls (move it there and define the kernel again), or pass it as a parameter"
    )
