"""The C++ launcher: one extension (``csrc/launcher*.cpp``), built once per
environment, that registers each pnex op's CUDA kernel with PyTorch's dispatcher.

:class:`NativeLauncher` owns that registration: :meth:`~NativeLauncher.register`
hands the C++ side the op's launch description
(:func:`~pnex_magic.launch.description.describe_launch`) and a callback that
returns the kernel's code for a device's architecture; the C++ side registers a
boxed functor for the CUDA dispatch key (and C++ autograd and ADInplaceOrView
fallbacks, so that a call runs no Python until an autograd formula is attached).
GPU calls then go from the dispatcher straight to ``cuLaunchKernel``.

An autotuned op also hands over a ``choose`` callback: the C++ side keeps a
key → block table and calls it (with the GIL) on the first call of each key; the
callback asks :func:`pnex_magic.launch.autotune.choose`, whose benchmark calls the
op again through the dispatcher with a candidate forced (:func:`forced_candidate`).

Ops it could not register (the extension failed to build here) are launched by
the Python :class:`~pnex_magic.launch.driver.DriverLauncher` instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..calls import launch_info
from . import autotune, build, checks
from .description import describe_launch
from .driver import DriverLauncher
from .hidden import hidden_arrays
from .kernel import Kernel


__all__ = ["NativeLauncher", "load_launcher", "available", "native_wanted", "forced_candidate", "last_kernel"]

log = logging.getLogger(__name__)

#: The launcher's translation units, by concern (see csrc/launcher.h), compiled in
#: parallel by ninja; each includes only the torch headers it needs.
SOURCES = tuple(build.CSRC / f"launcher_{part}.cpp" for part in ("faults", "call", "autotune", "register"))
#: Its own headers, part of the build key: the internal ones and the dlopen'd driver
#: table (shared with jax_ffi.cpp).
HEADERS = tuple(
    build.CSRC / name
    for name in ("launcher.h", "launcher_faults.h", "launcher_hidden.h", "launcher_python.h", "cuda_driver.h",
                 "cooperative.h")
)
_module: Any = None
_load_lock = threading.Lock()


def _build_key(*includes: str) -> str:
    return build.build_key([*SOURCES, *HEADERS], list(includes), _CFLAGS + _ldflags())


_CFLAGS = ["-O2"]


def _ldflags() -> list[str]:
    torch_lib = str(Path(torch.__file__).parent / "lib")
    return [f"-L{torch_lib}", "-lc10_cuda", "-ldl"]


def load_launcher(verbose: bool = False, built_only: bool = False):
    """Build (first time) and import the launcher extension; ``built_only``: import
    it only if it is built already (``None`` otherwise)."""
    global _module
    if _module is not None:
        return _module
    with _load_lock:
        if _module is not None:
            return _module
        includes = build.cuda_headers("C++ launcher", crt=True)
        _module = build.build_extension(
            "pnex_launcher",
            SOURCES,
            includes=includes,
            cflags=_CFLAGS,
            ldflags=_ldflags(),
            headers=HEADERS,
            what="C++ launcher",
            verbose=verbose,
            built_only=built_only,
        )
        return _module


def force_checked(op_name: str) -> None:
    """Launches of ``op_name`` on this thread run its checked variant ("": none)."""
    if _module is not None:
        _module.force_checked(op_name)


checks.follow(force_checked)  # the C++ side decides per launch: it follows checks.checked_launches


def install_fast_call(cls: type) -> bool:
    """Give the op class ``cls`` the launcher's C call slot (calls with positional
    arguments go to each object's ``_fast`` entry with no Python frame); False where the
    launcher is not loaded."""
    return _module is not None and bool(_module.install_fast_call(cls))


def last_kernel(device: int) -> str:
    """The kernel the C++ launcher launched last on cuda:``device`` ("" if none)."""
    return _module.last_kernel(device) if _module is not None else ""


def native_wanted() -> bool:
    return os.environ.get("PNEX_LAUNCHER", "native") != "driver" and torch.cuda.is_available()


def available() -> bool:
    """Whether the launcher is built and loaded (does not build it)."""
    return _module is not None


def launcher_spec(definition: Kernel) -> dict[str, Any]:
    """What the C++ side registers: the launch description plus ``get_image``, for an
    autotuned op ``choose``, and the hidden arguments (the device arrays the kernel reads
    as globals, :mod:`pnex_magic.snapshot`) as their tensors, which it passes at every
    launch."""

    def get_image(device_index: int, contiguous: bool, variant: int = 0, checked: bool = False) -> tuple[bytes, str]:
        arch = "sm_%d%d" % torch.cuda.get_device_capability(device_index)
        return definition.kernel_image(arch, "C" if contiguous else "A", variant, checked=checked)

    def describe(record: list[int]) -> str:
        error = definition.violation_error(record)
        return "" if error is None else str(error)

    def choose(device_index: int, contiguous: bool, key: tuple[int, ...], args: tuple | None) -> tuple[int, bool]:
        # args is None while the stream is capturing: nothing may run then.
        return autotune.choose(
            definition, device_index=device_index, layout="C" if contiguous else "A", key=tuple(key),
            capturing=args is None, runner=lambda: _runner(definition, device_index, args),
        )

    hidden = [(h.name, h.tensor(), h.dtype.name, h.ndim, h.contiguous, h.describe()) for h in hidden_arrays(definition)]
    return {
        **describe_launch(definition.spec), "get_image": get_image, "choose": choose, "describe": describe,
        "check": bool(getattr(definition.options, "check", False)), "hidden": hidden,
        "cooperative": bool(getattr(definition, "cooperative", False)),
    }


@contextlib.contextmanager
def forced_candidate(op_name: str, index: int) -> Iterator[None]:
    """Calls of ``op_name`` on this thread launch candidate ``index`` (the tuner's runs)."""
    _module.force_candidate(op_name, index)
    try:
        yield
    finally:
        _module.force_candidate("", -1)


def _runner(definition: Kernel, device_index: int, args: tuple) -> autotune.Runner:
    """Candidates run through the dispatcher, on copies of the ``InMut`` arguments."""
    spec = definition.spec
    op = getattr(torch.ops.pnex, definition.op_name).default
    inmut = [i for i, p in enumerate(spec.arguments) if p.role == "inmut"]
    call = list(args)
    for i in inmut:
        call[i] = args[i].clone()

    def run(index: int) -> list[torch.Tensor]:
        with forced_candidate(definition.op_name, index):
            out = op(*call)
        outs = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
        return outs + [call[i] for i in inmut]

    def reset() -> None:
        for i in inmut:
            call[i].copy_(args[i])

    def n_threads(variant: int) -> tuple[int, ...]:
        return launch_info(spec, args, variant=variant).n_threads

    return autotune.Runner(run, reset, n_threads, torch.device("cuda", device_index))


def _warn_python_launcher(definition: Kernel, exc: BaseException) -> None:
    text = str(exc).strip()
    log.warning(
        "pnex: kernel %r uses the Python GPU launcher (slower per call) because the C++ launcher "
        "is unavailable: %s",
        definition.spec.name,
        text.splitlines()[0] if text else type(exc).__name__,
    )


class NativeLauncher:
    """CUDA calls through the C++ launcher, registered with the dispatcher per op."""

    name = "native"

    def __init__(self) -> None:
        self._fallback = DriverLauncher()

    def register(self, definition: Kernel) -> bool:
        """Register the op's CUDA kernel with the dispatcher; ``False`` (and a warning)
        when the launcher cannot be built here, or the kernel has no compiled code."""
        if not native_wanted() or not definition.compiles:
            return False
        try:
            module = load_launcher(verbose=definition.options.verbose)
            module.register_op(definition.op_name, launcher_spec(definition), True)
        except Exception as exc:  # no compiler, no headers: the Python launcher still works
            _warn_python_launcher(definition, exc)
            return False
        return True

    def last_kernel(self, device: int) -> str:
        """The pnex kernel launched last on cuda:``device``, by either launcher ("" if none)."""
        return last_kernel(device) or self._fallback.last_kernel(device)

    def unregister(self, op_name: str) -> None:
        """Drop the C++ registration an earlier definition of ``op_name`` left."""
        if _module is not None:
            _module.unregister_op(op_name)

    def autograd_registered(self, definition: Kernel) -> None:
        """An autograd formula now exists: drop the C++ "not implemented" autograd kernel."""
        if _module is not None:
            _module.drop_autograd_fallback(definition.op_name)

    def candidate(self, definition: Kernel, values: Sequence[Any], device: torch.device) -> int:
        """The launch candidate of a call the Python launcher serves (registered ops
        choose in C++)."""
        return self._fallback.candidate(definition, values, device)

    def launch(
        self,
        definition: Kernel,
        values: Sequence[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        device: torch.device,
        variant: int = 0,
    ) -> None:
        """Calls of a registered op never reach Python; this serves the ops whose
        registration failed, through the Python launcher."""
        self._fallback.launch(definition, values, grid, block, device, variant)
