"""The XLA launcher: pnex kernels launched by XLA through ``jax.ffi``.

One C++ FFI handler (``csrc/jax_ffi.cpp``), built once per environment as a plain
shared library against jaxlib's headers (``jax.ffi.include_dir()``) and cuda.h
(in a background process, :func:`ready`; meanwhile traces launch through the
Python launcher), loaded with ``ctypes`` and registered as the FFI target
:data:`TARGET` for the CUDA platform, serves every kernel.  It is stateful: XLA runs its *instantiate*
stage once per call site when it builds an executable (the kernel's code is loaded
then, on every device) and its *execute* stage, which only launches, on every call;
it is registered command-buffer compatible, so XLA may record it into a CUDA graph.
This module is its Python side:

* :func:`call_layout` says how a kernel's parameters map onto the XLA call: its
  operands (the tensor arguments, then a filled buffer for each ``Out(init=...)``
  whose value no memset pattern expresses), its results (the ``Out`` tensors, then
  the new values of the ``InMut`` arguments), which results alias which operands
  (the ``InMut`` arguments, the kernel writes them in place) and how the handler
  fills each ``Out(init=...)`` result on XLA's stream (:func:`fill_pattern`); the
  same layout serves the CPU path;
* :func:`register_kernel` gives a kernel definition an id in the C++ registry,
  with its parameter table (from :func:`~pnex_magic.launch.description.describe_launch`),
  its bytes of dynamic shared memory (an id per ``Tune`` variant, so one number each)
  and its C-contiguous code for the GPU architectures asked for;
* :func:`scalar_slots` packs the scalar arguments into the 8-byte slots the
  handler passes to the kernel (:func:`~pnex_magic.launch.driver.scalar_slot`).

Nothing here imports jax at import time; :func:`load_library` does, when a GPU
call is first traced.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..arch import arch_name, parse_arch
from ..errors import KernelCompileError, KernelDefinitionError
from ..spec import KernelSpec, ScalarParam, TensorParam
from ..cache import folder as cache_folder
from . import background, build
from .description import KINDS, describe_launch
from .driver import scalar_slot
from .hidden import hidden_arrays
from .kernel import Kernel

__all__ = [
    "TARGET",
    "STATE_TYPE",
    "CallLayout",
    "call_layout",
    "fill_pattern",
    "scalar_slots",
    "load_library",
    "kernel_id",
    "register_kernel",
    "library_available",
    "ready",
    "handler_build",
]

log = logging.getLogger(__name__)

#: The FFI target name of the handler (platform "CUDA").
TARGET = "pnex_magic_launch"
#: The name its per-call-site state type is registered under.
STATE_TYPE = "pnex_magic_launch_state"
SOURCE = build.CSRC / "jax_ffi.cpp"
HEADERS = (build.CSRC / "cuda_driver.h", build.CSRC / "cooperative.h", build.CSRC / "shared_memory.h")

_library: ctypes.CDLL | None = None
_lock = threading.Lock()
_ids: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()  # per Tune variant
# The C++ registry keeps every kernel (a few kB of code each): an executable XLA compiled
# earlier may still launch a kernel whose definition is gone.
_archs: dict[int, set[str]] = {}  # kernel id -> architectures whose code the registry holds
_next_id = itertools.count(1)  # ids of kernels without a source key (below 2**62)


@dataclasses.dataclass(frozen=True)
class CallLayout:
    """How one kernel's parameters map onto an XLA call (see the module docstring)."""

    operands: tuple[str, ...]  #: parameter names: tensor arguments, then each Out(init=...) XLA fills
    results: tuple[str, ...]  #: parameter names: Out tensors, then InMut arguments
    aliases: Mapping[int, int]  #: operand index -> result index (InMut; an Out(init=...) XLA fills)
    table: tuple[int, ...]  #: per parameter (kind, index, rank, item size), flattened
    scalars: tuple[str, ...]  #: scalar parameter names, in slot order
    fills: tuple[int, ...] = ()  #: per result (memset width in bytes or 0, bit pattern), flattened


def fill_pattern(dtype: torch.dtype, value: float | int | bool) -> tuple[int, int] | None:
    """How a memset fills a buffer of ``dtype`` with ``value``: ``(width, pattern)``
    for ``cuMemsetD8/D16/D32Async`` (width 1, 2 or 4 bytes), or ``None`` where no
    pattern of at most 4 bytes repeats into the value's bits (an 8-byte value whose
    halves differ, such as ``1.5`` in float64).  The value is converted as
    ``torch.full`` converts it, so ``-0.0`` and NaN keep their bits."""
    raw = torch.tensor(value, dtype=dtype).reshape(1).view(torch.uint8).tolist()
    if all(b == raw[0] for b in raw):
        return 1, raw[0]
    if len(raw) == 2:
        return 2, int.from_bytes(bytes(raw), "little")
    if len(raw) == 4 or (len(raw) == 8 and raw[:4] == raw[4:]):
        return 4, int.from_bytes(bytes(raw[:4]), "little")
    return None


def call_layout(spec: KernelSpec) -> CallLayout:
    """The :class:`CallLayout` of ``spec``."""
    arguments = [p for p in spec.arguments if isinstance(p, TensorParam)]
    patterns = {p.name: fill_pattern(p.dtype.torch, p.init) for p in spec.outputs if p.init is not None}
    filled = [p for p in spec.outputs if p.name in patterns and patterns[p.name] is None]
    operands = tuple(p.name for p in [*arguments, *filled])
    results = tuple(p.name for p in [*spec.outputs, *(p for p in arguments if p.role == "inmut")])
    scalars = tuple(p.name for p in spec.arguments if isinstance(p, ScalarParam))
    aliases = {operands.index(name): results.index(name) for name in operands if name in results}
    fills: list[int] = []
    for name in results:
        fills += patterns.get(name) or (0, 0)
    table: list[int] = []
    for p, entry in zip(spec.params, describe_launch(spec)["params"], strict=True):
        if p.role == "in":
            index = operands.index(p.name)
        elif p.role in ("inmut", "out"):
            index = results.index(p.name)
        elif p.role == "scalar":
            index = scalars.index(p.name)
        else:
            index = 0
        table += [KINDS[p.role], index, entry["ndim"], entry["itemsize"]]
    return CallLayout(operands, results, aliases, tuple(table), scalars, tuple(fills))


def scalar_slots(spec: KernelSpec, env: Mapping[str, Any]) -> list[int]:
    """The scalar arguments in ``env``, packed into 8-byte slots in slot order (at
    least one slot: XLA attributes cannot be empty arrays)."""
    slots = [scalar_slot(p.dtype.name, env[p.name]) for p in spec.arguments if isinstance(p, ScalarParam)]
    return slots or [0]


def _include_dirs() -> list[str]:
    import jax.ffi

    return [jax.ffi.include_dir(), *build.cuda_headers("XLA FFI handler")]


_STEM = "pnex_jax_ffi"
_FLAGS = ("-O2", "-w")
_LDFLAGS = ("-ldl",)


def _quick_key() -> str:
    """What the built library depends on that is cheap to read: its sources, jaxlib's
    version (whose headers it includes), the compiler and flags.  (The build key
    proper also names the CUDA header folders, whose lookup imports
    ``torch.utils.cpp_extension``: a fifth of a second a process should not pay
    once the library exists.)"""
    import jaxlib

    h = hashlib.sha256()
    for source in (SOURCE, *HEADERS):
        h.update(source.read_bytes())
    h.update(f"{jaxlib.__version__}|{os.environ.get('CXX') or 'c++'}|{_FLAGS}|{_LDFLAGS}".encode())
    return h.hexdigest()[:16]


def _pointer() -> Path:
    return cache_folder("launcher") / f"{_STEM}.current.json"


def _stamp(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def handler_build(verbose: bool = False) -> build.Build:
    """The handler's :class:`~pnex_magic.launch.build.Build` (a clear ``KernelCompileError``
    where the CUDA headers are missing)."""
    import jaxlib

    return build.Build(
        _STEM, "library", "XLA FFI handler", (str(SOURCE),), includes=tuple(_include_dirs()), cflags=_FLAGS,
        ldflags=_LDFLAGS, headers=tuple(str(h) for h in HEADERS), key_extra=f"jaxlib={jaxlib.__version__}", verbose=verbose,
    )


def _recorded() -> Path | None:
    """The library the small record beside the builds names, if it is still the one
    for these sources, jaxlib, compiler and flags."""
    key = _quick_key()
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        recorded = json.loads(_pointer().read_text())
        path = Path(recorded["path"])
        if recorded.get("key") == key and {"key": key, **_stamp(path)} == recorded:
            return path
    return None


def _record(path: Path) -> Path:
    with contextlib.suppress(OSError):
        pointer = _pointer()
        partial = pointer.with_name(f"{pointer.name}.{os.getpid()}")
        partial.write_text(json.dumps({"key": _quick_key(), **_stamp(path)}))
        partial.replace(pointer)  # whole or absent, for a process reading it now
    return path


def build_library(verbose: bool = False) -> Path:
    """Build (first time, in the foreground) the FFI handler's shared library; returns
    its path.  A library built before for the same sources, jaxlib, compiler and flags
    is found through a small record beside it, without looking for the CUDA headers
    again."""
    found = _recorded()
    if found is not None:
        return found
    return _record(background.build_now(handler_build(verbose)))


_noted: list[str] = []


def ready(verbose: bool = False) -> bool:
    """Whether the handler serves a GPU trace now: it is loaded, or built (then loaded
    now).  Otherwise its build starts in a background process (:mod:`.background`),
    once, and the trace launches through the Python launcher instead (see
    :mod:`pnex_magic.frontends.jax`); where it cannot be built, one note per process
    says why.  ``PNEX_LAUNCHER=native`` builds it in the foreground (a failure raises),
    ``PNEX_LAUNCHER=driver`` never uses it."""
    if _library is not None:
        return True
    mode = os.environ.get("PNEX_LAUNCHER", "auto")
    if mode == "driver":
        return False
    if mode != "native" and _recorded() is None:
        try:
            target = _handler_target(verbose)
        except KernelCompileError as exc:
            return _note(str(exc))
        library = target.built()
        if library is None:
            why = background.problem(target)
            if why is not None:
                return _note(why)
            background.start(target)
            return False
        _record(library)
    load_library(verbose)
    return True


_targets: dict[bool, build.Build] = {}


def _handler_target(verbose: bool) -> build.Build:
    found = _targets.get(verbose)
    if found is None:
        found = _targets[verbose] = handler_build(verbose)
    return found


def _note(why: str) -> bool:
    if not _noted:
        _noted.append(why)
        log.warning("pnex: JAX launches pnex kernels on the GPU through a Python callback (slower per call than "
                    "the XLA FFI handler): %s", why)
    return False


def _declare(lib: ctypes.CDLL) -> None:
    lib.pnex_jax_register.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    lib.pnex_jax_register.restype = ctypes.c_int
    lib.pnex_jax_add_image.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p]
    lib.pnex_jax_add_image.restype = ctypes.c_int
    lib.pnex_jax_set_cooperative.argtypes = [ctypes.c_int64]
    lib.pnex_jax_set_cooperative.restype = ctypes.c_int
    lib.pnex_jax_set_shared.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.pnex_jax_set_shared.restype = ctypes.c_int
    lib.pnex_jax_archs.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    lib.pnex_jax_archs.restype = ctypes.c_int64
    lib.pnex_jax_loaded.argtypes = [ctypes.c_int64]
    lib.pnex_jax_loaded.restype = ctypes.c_int64
    lib.pnex_jax_driver_error.restype = ctypes.c_char_p
    lib.pnex_jax_state_type_id.restype = ctypes.c_void_p
    lib.pnex_jax_state_type_info.restype = ctypes.c_void_p


def handler_bundle(lib: ctypes.CDLL) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``jax.ffi`` registers: the state type (``register_ffi_type``) and the
    handler's stages (``register_ffi_target``)."""
    import jax.ffi

    state = {
        "type_id": jax.ffi.pycapsule(lib.pnex_jax_state_type_id()),
        "type_info": jax.ffi.pycapsule(lib.pnex_jax_state_type_info()),
    }
    stages = {"instantiate": jax.ffi.pycapsule(lib.PnexJaxInstantiate), "execute": jax.ffi.pycapsule(lib.PnexJaxLaunch)}
    return state, stages


def load_library(verbose: bool = False) -> ctypes.CDLL:
    """Build (first time) and load the handler, and register it with XLA as
    :data:`TARGET` for the CUDA platform, with its state type (once per process)."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is not None:
            return _library
        import jax.ffi

        lib = ctypes.CDLL(str(build_library(verbose)))
        _declare(lib)
        state, stages = handler_bundle(lib)
        # The CUDA backend first: a backend that starts later registers the targets queued
        # for it, and may do so before the queued types, which XLA refuses.
        with contextlib.suppress(RuntimeError):
            jax.devices("cuda")
        jax.ffi.register_ffi_type(STATE_TYPE, state, platform="CUDA")
        jax.ffi.register_ffi_target(TARGET, stages, platform="CUDA")
        _library = lib
        return lib


def library_available() -> bool:
    """Whether the handler is loaded (does not build it)."""
    return _library is not None


def _new_id(definition: Kernel, variant: int = 0) -> int:
    """A kernel's id: a hash of its source, interface, options and ``Tune`` variant where
    it has them (the same kernel gets the same id in every process, so an executable
    XLA compiled from the same program calls the same kernel), else a counter."""
    source_key = getattr(definition, "source_key", None)
    if source_key is None:
        return next(_next_id)
    text = f"{source_key}|max_registers={definition.options.max_registers}"
    if variant:
        text += f"|variant={variant}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**62 - 1) | 2**62


def kernel_id(definition: Kernel, variant: int = 0) -> int:
    """The id the handler knows ``definition`` (its ``Tune`` variant ``variant``) by,
    registered or not: an export for the CUDA platform on a machine without one names
    the kernel by it too.

    Raises
    ------
    KernelDefinitionError
        The kernel reads a device array as a global (a hidden argument,
        :mod:`pnex_magic.snapshot`), which the handler does not pass: XLA owns the
        buffers of a call, and a torch tensor held by the kernel is not one of them.
    """
    names = [h.name for h in hidden_arrays(definition)]
    if names:
        raise KernelDefinitionError(
            f"kernel {definition.spec.name!r} reads the device array(s) {', '.join(map(repr, names))} as globals, "
            f"which pnex passes to the kernel at each launch as hidden arguments; a JAX computation on a GPU "
            f"launches with XLA's buffers only and does not pass them. Make each a parameter of the kernel (an In "
            f"or InMut argument) to call it from JAX on a GPU (on CPU, JAX runs it through the simulator)"
        )
    with _lock:
        ids = _ids.setdefault(definition, {})
        found = ids.get(variant)
        if found is None:
            found = ids[variant] = _new_id(definition, variant)
        return found


def register_kernel(definition: Kernel, archs: Iterable[str], verbose: bool = False, variant: int = 0) -> int:
    """The id of ``definition`` in the handler's registry, registering it (first time)
    with its parameter table and adding its code for every architecture of ``archs``
    (``"sm_90"``, ``"9.0"``) it does not have yet.  Compiles what the cache lacks
    (a kernel the PyTorch op already launched is compiled: its code is reused)."""
    lib = load_library(verbose)
    found = kernel_id(definition, variant)
    with _lock:
        if found not in _archs:
            table = call_layout(definition.spec).table
            array = (ctypes.c_int64 * len(table))(*table)
            lib.pnex_jax_register(found, definition.spec.name.encode(), len(table) // 4, array)
            if getattr(definition, "cooperative", False):  # a grid sync: launched cooperatively
                lib.pnex_jax_set_cooperative(found)
            shared = definition.spec.shared_of(variant)  # an id per Tune variant: its bytes
            if shared:  # dynamic shared memory per block: checked and opted in where the code loads
                lib.pnex_jax_set_shared(found, shared)
            _archs[found] = set()
        for arch in sorted({arch_name(parse_arch(a)) for a in archs} - _archs[found]):
            image, entry = definition.kernel_image(arch, "C", variant)
            major, minor = parse_arch(arch)
            lib.pnex_jax_add_image(found, 10 * major + minor, image, len(image), entry.encode())
            _archs[found].add(arch)
        return found
