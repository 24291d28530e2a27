"""Launch stage: run a compiled kernel on concrete arguments.

Every back end implements :class:`Launcher`: the CUDA simulator for CPU tensors
(:mod:`.simulator`), and for CUDA tensors :mod:`.switch`'s launcher: the C++
launcher (:mod:`.native`), or the Python driver-API launcher (:mod:`.driver`)
while the C++ one builds in the background, where it cannot be built, or with
``PNEX_LAUNCHER=driver``.  The op stage talks to this package only:

* when an op is made, :func:`register` offers its definition to every launcher;
  a launcher that registers a dispatcher kernel of its own (the C++ launcher)
  says so, and the op's Python implementation then never sees that device; one
  still being built registers it later (:func:`native_registered` says when), and
  the op's calls go through :func:`call` meanwhile;
* every other call reaches :meth:`Launcher.launch` through :func:`launcher_for`,
  after :meth:`Launcher.candidate` picked the block and ``Tune`` variant of an
  autotuned op.

:mod:`.xla` is the launch stage of the JAX front end on a GPU: XLA, not the op,
calls its FFI handler, so it is not a :class:`Launcher`; on CPU the JAX front end
uses the simulator's launcher like the op does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from ..errors import KernelLaunchError
from .faults import fault_sentence, is_fault
from .kernel import Kernel
from . import native, switch
from .switch import NativeLauncher
from .simulator import SimulatorLauncher


__all__ = [
    "Launcher", "launcher_for", "register_launcher", "register", "unregister", "autograd_registered",
    "last_kernel", "is_fault", "fault_hint", "install_fast_call", "call", "native_registered", "wait_for_launcher",
]


class Launcher(Protocol):
    name: str

    def register(self, definition: Kernel) -> bool:
        """Prepare to run ``definition``'s op.  ``True`` means the launcher registered
        a dispatcher kernel of its own for its device type, which then serves calls
        without the op's Python implementation."""

    def unregister(self, op_name: str) -> None:
        """Forget what :meth:`register` did for an earlier op of this name."""

    def autograd_registered(self, definition: Kernel) -> None:
        """The op got an autograd formula (a registered launcher may have to step aside)."""

    def candidate(self, definition: Kernel, values: Sequence[Any], device: torch.device) -> int:
        """Which of an autotuned op's launch candidates (block shape and ``Tune``
        variant, :attr:`~pnex_magic.spec.KernelSpec.launch_candidates`) a call runs
        (``values`` as for :meth:`launch`); the GPU launchers autotune (:mod:`.autotune`),
        the simulator takes the first."""

    def launch(
        self,
        definition: Kernel,
        values: Sequence[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        device: torch.device,
        variant: int = 0,
    ) -> None:
        """Run the kernel once.  ``values`` holds one entry per kernel parameter, in
        declaration order: tensors (outputs already allocated), Python scalars, the
        values of the ``Tune`` parameters for ``variant``, and ``None`` for unused
        parameters."""


# CUDA: the C++ launcher registers each op it can (not with PNEX_LAUNCHER=driver, read
# per op) and hands every other CUDA call to the Python driver launcher.
_FACTORIES: dict[str, Callable[[], Launcher]] = {"cpu": SimulatorLauncher, "cuda": NativeLauncher}
_INSTANCES: dict[str, Launcher] = {}


def register_launcher(device_type: str, factory: Callable[[], Launcher]) -> None:
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


def _all() -> list[Launcher]:
    return [launcher_for(torch.device(device_type)) for device_type in list(_FACTORIES)]


def register(definition: Kernel) -> frozenset[str]:
    """Offer a new op to every launcher; returns the device types whose calls a
    launcher's own dispatcher kernel serves."""
    return frozenset(dt for dt in list(_FACTORIES) if launcher_for(torch.device(dt)).register(definition))


def unregister(op_name: str) -> None:
    for launcher in _all():
        launcher.unregister(op_name)


def install_fast_call(cls: type) -> bool:
    """Give the op class ``cls`` the C++ launcher's call slot, once it serves (see
    :func:`pnex_magic.launch.native.install_fast_call`)."""
    return native.install_fast_call(cls)


#: Run one call of an op object, ``call(fn, args)``: ``fn(*args)``, counted while ops
#: wait for the C++ launcher (:func:`pnex_magic.launch.switch.call`).
call = switch.call


def native_registered(op_name: str) -> bool:
    """Whether the C++ launcher's own dispatcher kernels serve ``op_name``'s CUDA calls."""
    return native.registered(op_name)


def wait_for_launcher(timeout: float | None = None) -> bool:
    """Wait until the C++ launcher serves CUDA calls, ops defined so far included (see
    :func:`pnex_magic.launch.switch.wait`)."""
    return switch.wait(timeout)


def autograd_registered(definition: Kernel) -> None:
    for launcher in _all():
        launcher.autograd_registered(definition)


# Where CUDA's report of a fault surfaces (the op's own calls, build_report, IPython's
# handler for torch.AcceleratorError), these name the likely kernel (see .faults).
def last_kernel(device_index: int) -> str:
    """The pnex kernel launched last on cuda:``device_index`` in this process ("" if none)."""
    launcher = _INSTANCES.get("cuda")
    get = getattr(launcher, "last_kernel", None)
    return get(device_index) if get is not None else ""


def fault_hint() -> str:
    """Which pnex kernels ran last, per device, and how to have the faulting one named
    ("" if this process launched none)."""
    try:
        count = torch.cuda.device_count()
    except Exception:  # a broken CUDA set-up: nothing to say
        count = 0
    ran = [(i, last_kernel(i)) for i in range(count)]
    # issue 21: the one sentence of launch/faults.py (context lost, last kernel, --check / --sanitize)
    return fault_sentence(f"'{name}' on cuda:{i}" for i, name in ran if name)
