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

Building the extension takes tens of seconds: :mod:`.switch` has ops served by the
Python driver launcher while it builds in the background, and moves them onto it
(:func:`register`) once it is built.  This module loads it (a launcher shipped in
the package, :data:`PREBUILT`, else the one built here: :func:`load_launcher`) and
registers ops with it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..calls import launch_info
from ..errors import KernelCompileError
from . import autotune, background, build, checks
from .description import describe_launch
from .hidden import hidden_arrays
from .kernel import Kernel


__all__ = [
    "load_launcher", "launcher_build", "available", "native_wanted", "forced_candidate", "last_kernel", "registered",
    "register", "unregister", "drop_autograd_fallback", "install_fast_call", "hold_fast_call", "launcher_spec",
    "PREBUILT",
]

log = logging.getLogger(__name__)

#: The launcher's translation units, by concern (see csrc/launcher.h), compiled in
#: parallel by ninja; each includes only the torch headers it needs.
SOURCES = tuple(build.CSRC / f"launcher_{part}.cpp" for part in ("faults", "call", "autotune", "dispatch", "register"))
#: Its own headers, part of the build key: the internal ones and the dlopen'd driver
#: table (shared with jax_ffi.cpp).
HEADERS = tuple(
    build.CSRC / name
    for name in ("launcher.h", "launcher_faults.h", "launcher_hidden.h", "launcher_python.h", "cuda_driver.h",
                 "cooperative.h", "shared_memory.h")
)
#: Where a launcher built elsewhere would be found, used without any build (none ships
#: with pnex_magic: see the README's "How it works").
PREBUILT = Path(__file__).resolve().parent.parent / "prebuilt"
_module: Any = None
_load_lock = threading.Lock()

_CFLAGS = ["-O2"]


def _ldflags() -> list[str]:
    torch_lib = str(Path(torch.__file__).parent / "lib")
    return [f"-L{torch_lib}", "-lc10_cuda", "-ldl"]


def _build_key(*includes: str) -> str:
    return build.build_key([*SOURCES, *HEADERS], list(includes), _CFLAGS + _ldflags())


def launcher_build(verbose: bool = False) -> build.Build:
    """The launcher's :class:`~pnex_magic.launch.build.Build` here (a clear
    ``KernelCompileError`` where the CUDA headers are missing)."""
    return build.Build(
        "pnex_launcher", "extension", "C++ launcher", tuple(map(str, SOURCES)),
        includes=tuple(build.cuda_headers("C++ launcher", crt=True)), cflags=tuple(_CFLAGS),
        ldflags=tuple(_ldflags()), headers=tuple(map(str, HEADERS)), verbose=verbose,
    )


_targets: dict[bool, build.Build] = {}


def _target(verbose: bool = False) -> build.Build:
    """:func:`launcher_build`, looked up once per process."""
    found = _targets.get(verbose)
    if found is None:
        found = _targets[verbose] = launcher_build(verbose)
    return found


def _prebuilt() -> Any | None:
    """A launcher shipped in the package (``prebuilt/launcher.json`` names its module, its
    library and the torch versions, major.minor, it serves), imported without any
    build; ``None`` where there is none for this torch (none ships with pnex_magic)."""
    try:
        manifest = json.loads((PREBUILT / "launcher.json").read_text())
        serves = ".".join(torch.__version__.split("+")[0].split(".")[:2]) in manifest["torch"]
        return build.import_library(manifest["module"], PREBUILT / manifest["library"]) if serves else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_launcher(verbose: bool = False, built_only: bool = False):
    """Import the launcher, building it first (in the foreground) if it is not built;
    ``built_only``: import it only if it is built already (``None`` otherwise)."""
    if _module is not None:
        return _module
    with _load_lock:
        if _module is not None:
            return _module
        module = _prebuilt()
        if module is None:
            target = _target(verbose)
            if not built_only:
                background.build_now(target)
            module = build.import_built(target.name, target.folder)
            if module is None and not built_only:
                raise KernelCompileError(f"pnex built its C++ launcher in {target.folder}, but it does not import")
        if module is not None:
            _loaded(module)
        return _module


def _loaded(module: Any) -> None:
    global _module
    _module = module
    _module.force_checked(checks.forced_name())  # this thread's checked launches, if any
    _install_fast_call()


def force_checked(op_name: str) -> None:
    """Launches of ``op_name`` on this thread run its checked variant ("": none)."""
    if _module is not None:
        _module.force_checked(op_name)


checks.follow(force_checked)  # the C++ side decides per launch: it follows checks.checked_launches


_fast_call_class: list[type] = []
_fast_call_held = [False]


def install_fast_call(cls: type) -> bool:
    """Give the op class ``cls`` the launcher's C call slot (calls with positional
    arguments go to each object's ``_fast`` entry with no Python frame) once the
    launcher is loaded and the slot is not held back (:func:`hold_fast_call`); returns
    whether it has it now."""
    if cls not in _fast_call_class:
        _fast_call_class.append(cls)
    return _install_fast_call()


def hold_fast_call(held: bool) -> None:
    """Hold the C call slot back (while ops wait for the switch, their op-object calls
    are counted by Python code the slot would skip: :mod:`.switch`), or let it in."""
    _fast_call_held[0] = held
    _install_fast_call()


def _install_fast_call() -> bool:
    if _module is None or _fast_call_held[0] or not _fast_call_class:
        return False
    return bool(_module.install_fast_call(_fast_call_class[0]))


def last_kernel(device: int) -> str:
    """The kernel the C++ launcher launched last on cuda:``device`` ("" if none)."""
    return _module.last_kernel(device) if _module is not None else ""


def native_wanted() -> bool:
    return os.environ.get("PNEX_LAUNCHER", "auto") != "driver" and torch.cuda.is_available()


def _foreground() -> bool:
    """``PNEX_LAUNCHER=native``: build the launcher before the first op uses it."""
    return os.environ.get("PNEX_LAUNCHER", "auto") == "native"


def available() -> bool:
    """Whether the launcher is built and loaded (does not build it)."""
    return _module is not None


_registered: set[str] = set()


def registered(op_name: str) -> bool:
    """Whether the C++ launcher's kernels serve ``op_name``'s CUDA calls."""
    return op_name in _registered


def register(definition: Kernel, autograd_fallback: bool = True) -> None:
    """Register ``definition``'s op with the loaded launcher (its CUDA kernel; with
    ``autograd_fallback``, C++ autograd kernels: no Python per call until an autograd
    formula is attached)."""
    _module.register_op(definition.op_name, launcher_spec(definition), autograd_fallback)
    _registered.add(definition.op_name)


def unregister(op_name: str) -> None:
    """Drop the C++ registration an earlier definition of ``op_name`` left."""
    _registered.discard(op_name)
    if _module is not None:
        _module.unregister_op(op_name)


def drop_autograd_fallback(op_name: str) -> None:
    """An autograd formula now exists for ``op_name``: the C++ autograd kernels step aside."""
    if _module is not None:
        _module.drop_autograd_fallback(op_name)


_violations = threading.local()


def taken_violation(message: str) -> Exception | None:
    """The :class:`~pnex_magic.errors.KernelIndexError` (with its ``violation`` and
    ``site``) that this thread's last checked launch through the C++ launcher decoded,
    if its message is ``message`` (what the C++ side raised as an ``IndexError``);
    ``None`` otherwise.  It is given once."""
    error, _violations.last = getattr(_violations, "last", None), None
    return error if error is not None and str(error) == message else None


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
        _violations.last = error  # the C++ side raises IndexError(str(error)): taken_violation() gives it back whole
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
        # thread-block clusters: the grid must be a whole number of them (clusters.grid_problem)
        **({"cluster_dims": list(definition.spec.cluster_dims)} if definition.spec.cluster_dims else {}),
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
    values = list(args)
    for i in inmut:
        values[i] = args[i].clone()

    def run(index: int) -> list[torch.Tensor]:
        with forced_candidate(definition.op_name, index):
            out = op(*values)
        outs = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
        return outs + [values[i] for i in inmut]

    def reset() -> None:
        for i in inmut:
            values[i].copy_(args[i])

    def n_threads(variant: int) -> tuple[int, ...]:
        return launch_info(spec, args, variant=variant).n_threads

    return autotune.Runner(run, reset, n_threads, torch.device("cuda", device_index))


