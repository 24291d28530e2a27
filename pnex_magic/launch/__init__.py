"""Launch stage: run a compiled kernel on concrete arguments.

Every back end implements :class:`Launcher`; :func:`launcher_for` picks the one for
a tensor's device: the CUDA simulator for CPU tensors, the GPU launcher for CUDA
tensors.  The op stage only ever talks to this interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..errors import KernelLaunchError

if TYPE_CHECKING:
    from ..definition import KernelDefinition

__all__ = ["Launcher", "launcher_for", "register_launcher"]


class Launcher(Protocol):
    name: str

    def launch(
        self,
        definition: KernelDefinition,
        values: Sequence[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        device: torch.device,
    ) -> None:
        """Run the kernel once.  ``values`` holds one entry per kernel parameter, in
        declaration order: tensors (outputs already allocated), Python scalars, and
        ``None`` for unused parameters."""


_FACTORIES: dict[str, Any] = {}
_INSTANCES: dict[str, Launcher] = {}


def register_launcher(device_type: str, factory) -> None:
    """Make ``factory()`` the launcher for tensors of ``device_type``."""
    _FACTORIES[device_type] = factory
    _INSTANCES.pop(device_type, None)


def launcher_for(device: torch.device) -> Launcher:
    launcher = _INSTANCES.get(device.type)
    if launcher is None:
        factory = _FACTORIES.get(device.type)
        if factory is None:
            raise KernelLaunchError(
                f"no pnex back end runs kernels on {device.type!r} tensors; "
                f"use CPU tensors (CUDA simulator) or CUDA tensors (GPU)"
            )
        launcher = factory()
        _INSTANCES[device.type] = launcher
    return launcher


def _simulator():
    from .simulator import SimulatorLauncher

    return SimulatorLauncher()


def _gpu():
    from .gpu import make_gpu_launcher

    return make_gpu_launcher()


register_launcher("cpu", _simulator)
register_launcher("cuda", _gpu)
