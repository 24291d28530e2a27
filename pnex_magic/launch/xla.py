"""The XLA launcher: pnex kernels launched by XLA through ``jax.ffi``.

One C++ FFI handler (``csrc/jax_ffi.cpp``), built once per environment as a plain
shared library against jaxlib's headers (``jax.ffi.include_dir()``) and cuda.h,
loaded with ``ctypes`` and registered as the FFI target :data:`TARGET` for the
CUDA platform, serves every kernel.  This module is its Python side:

* :func:`call_layout` says how a kernel's parameters map onto an ``ffi_call``:
  its operands (the tensor arguments, then a filled buffer per ``Out(init=...)``),
  its results (the ``Out`` tensors, then the new values of the ``InMut`` arguments)
  and which results alias which operands; the same layout serves the CPU path;
* :func:`register_kernel` gives a kernel definition an id in the C++ registry,
  with its parameter table (from :func:`~pnex_magic.launch.description.describe_launch`)
  and its C-contiguous code for the GPU architectures asked for;
* :func:`scalar_slots` packs the scalar arguments into the 8-byte slots the
  handler passes to the kernel (:func:`~pnex_magic.launch.driver.scalar_slot`).

Nothing here imports jax at import time; :func:`load_library` does, when a GPU
call is first traced.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import itertools
import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from ..arch import arch_name, parse_arch
from ..spec import KernelSpec, ScalarParam, TensorParam
from . import build
from .description import KINDS, describe_launch
from .driver import scalar_slot
from .kernel import Kernel

__all__ = ["TARGET", "CallLayout", "call_layout", "scalar_slots", "load_library", "register_kernel", "library_available"]

#: The FFI target name of the handler (platform "CUDA").
TARGET = "pnex_magic_launch"
SOURCE = build.CSRC / "jax_ffi.cpp"
HEADER = build.CSRC / "cuda_driver.h"

_library: ctypes.CDLL | None = None
_lock = threading.Lock()
_ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# The C++ registry keeps every kernel (a few kB of code each): an executable XLA compiled
# earlier may still launch a kernel whose definition is gone.
_archs: dict[int, set[str]] = {}  # kernel id -> architectures whose code the registry holds
_next_id = itertools.count(1)  # ids of kernels without a source key (below 2**62)


@dataclasses.dataclass(frozen=True)
class CallLayout:
    """How one kernel's parameters map onto an XLA call (see the module docstring)."""

    operands: tuple[str, ...]  #: parameter names: tensor arguments, then one per Out(init=...)
    results: tuple[str, ...]  #: parameter names: Out tensors, then InMut arguments
    aliases: Mapping[int, int]  #: operand index -> result index (InMut, Out(init=...))
    table: tuple[int, ...]  #: per parameter (kind, index, rank, item size), flattened
    scalars: tuple[str, ...]  #: scalar parameter names, in slot order


def call_layout(spec: KernelSpec) -> CallLayout:
    """The :class:`CallLayout` of ``spec``."""
    arguments = [p for p in spec.arguments if isinstance(p, TensorParam)]
    filled = [p for p in spec.outputs if p.init is not None]
    operands = tuple(p.name for p in [*arguments, *filled])
    results = tuple(p.name for p in [*spec.outputs, *(p for p in arguments if p.role == "inmut")])
    scalars = tuple(p.name for p in spec.arguments if isinstance(p, ScalarParam))
    aliases = {operands.index(name): results.index(name) for name in operands if name in results}
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
    return CallLayout(operands, results, aliases, tuple(table), scalars)


def scalar_slots(spec: KernelSpec, env: Mapping[str, Any]) -> list[int]:
    """The scalar arguments in ``env``, packed into 8-byte slots in slot order (at
    least one slot: XLA attributes cannot be empty arrays)."""
    slots = [scalar_slot(p.dtype.name, env[p.name]) for p in spec.arguments if isinstance(p, ScalarParam)]
    return slots or [0]


def _include_dirs() -> list[str]:
    import jax.ffi

    return [jax.ffi.include_dir(), *build.cuda_headers("XLA FFI handler")]


def build_library(verbose: bool = False):
    """Build (first time) the FFI handler's shared library; returns its path."""
    import jaxlib

    return build.build_shared_library(
        "pnex_jax_ffi",
        [SOURCE],
        includes=_include_dirs(),
        headers=[HEADER],
        cflags=["-O2", "-w"],
        ldflags=["-ldl"],
        key_extra=f"jaxlib={jaxlib.__version__}",
        what="XLA FFI handler",
        verbose=verbose,
    )


def load_library(verbose: bool = False) -> ctypes.CDLL:
    """Build (first time) and load the handler, and register it with XLA as
    :data:`TARGET` for the CUDA platform (once per process)."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is not None:
            return _library
        import jax.ffi

        lib = ctypes.CDLL(str(build_library(verbose)))
        lib.pnex_jax_register.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
        lib.pnex_jax_register.restype = ctypes.c_int
        lib.pnex_jax_add_image.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p]
        lib.pnex_jax_add_image.restype = ctypes.c_int
        lib.pnex_jax_archs.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
        lib.pnex_jax_archs.restype = ctypes.c_int64
        lib.pnex_jax_driver_error.restype = ctypes.c_char_p
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.PnexJaxLaunch), platform="CUDA")
        _library = lib
        return lib


def library_available() -> bool:
    """Whether the handler is loaded (does not build it)."""
    return _library is not None


def _new_id(definition: Kernel) -> int:
    """A kernel's id: a hash of its source, interface and options where it has them
    (the same kernel gets the same id in every process, so an executable XLA
    compiled from the same program calls the same kernel), else a counter."""
    source_key = getattr(definition, "source_key", None)
    if source_key is None:
        return next(_next_id)
    text = f"{source_key}|max_registers={definition.options.max_registers}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**62 - 1) | 2**62


def register_kernel(definition: Kernel, archs: Iterable[str], verbose: bool = False) -> int:
    """The id of ``definition`` in the handler's registry, registering it (first time)
    with its parameter table and adding its code for every architecture of ``archs``
    (``"sm_90"``, ``"9.0"``) it does not have yet.  Compiles what the cache lacks."""
    lib = load_library(verbose)
    with _lock:
        kernel_id = _ids.get(definition)
        if kernel_id is None:
            kernel_id = _new_id(definition)
            table = call_layout(definition.spec).table
            array = (ctypes.c_int64 * len(table))(*table)
            lib.pnex_jax_register(kernel_id, definition.spec.name.encode(), len(table) // 4, array)
            _ids[definition] = kernel_id
            _archs.setdefault(kernel_id, set())
        for arch in sorted({arch_name(parse_arch(a)) for a in archs} - _archs[kernel_id]):
            image, entry = definition.kernel_image(arch, "C")
            major, minor = parse_arch(arch)
            lib.pnex_jax_add_image(kernel_id, 10 * major + minor, image, len(image), entry.encode())
            _archs[kernel_id].add(arch)
        return kernel_id
