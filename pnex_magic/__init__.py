"""pnex_magic: write a custom GPU kernel for PyTorch from a notebook.

A Python function written as a Numba-CUDA kernel, its parameters annotated
``In``, ``InMut``, ``Out``, ``Scalar`` or ``Unused`` (and compile-time constants
``Tune``, chosen by the autotuner), becomes a PyTorch custom
operator with :func:`jit` (or the ``%%pnex`` cell magic: ``%load_ext pnex_magic``).
The operator works eagerly, under ``torch.compile(fullgraph=True)`` and in CUDA
graphs; on CPU tensors it runs through numba-cuda's CUDA simulator.
:func:`inspect` reports the schema, PTX and resource usage without a GPU.
Inside a kernel, :func:`vload` and :func:`vstore` read and write several
consecutive elements in one vector instruction (what bandwidth-bound kernels need),
and :mod:`pnex_magic.random` draws counter-based random numbers (Philox4x32-10)
from a ``Seed`` parameter that each call draws from PyTorch's generator;
:func:`xoroshiro128p_states` makes the states Numba's xoroshiro128+ functions take.
:func:`jax_op` makes the same op a JAX function (``jax.jit``, ``grad``, ``vmap``);
JAX is imported only then.
:func:`save` writes an op as one self-contained file that :func:`load` registers
again in a process with torch alone (no Numba, no CUDA compiler).
"""

# No ``from __future__ import annotations`` here: it binds the name ``annotations`` in this
# package, and after ``importlib.reload(pnex_magic)`` (``%reload_ext pnex_magic``) that
# name would stay the __future__ feature instead of the ``pnex_magic.annotations``
# submodule, for every ``from pnex_magic import annotations`` made afterwards.

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .annotations import In, InMut, Out, Scalar, Seed, Tune, Unused
from .vector import vload, vstore
from .errors import (
    ArgumentShapeError,
    ArgumentTypeError,
    ArgumentValueError,
    ArtifactError,
    KernelCompileError,
    KernelDefinitionError,
    KernelIndexError,
    KernelLaunchError,
    KernelTypingError,
    PnexError,
    ShapeExpressionError,
)

if TYPE_CHECKING:
    from . import autograd
    from .artifact import load, save
    from .adjoint import derive_backward
    from .autograd import attach_backward, backward_of
    from .frontends.jit import jit
    from . import random, tc
    from .op import PnexOp
    from .random import xoroshiro128p_states
    from .report import KernelReport, build_report, inspect
    from .profiling import KernelProfile, profile

# Imported on first use (PEP 562), so that ``import pnex_magic`` stays cheap: the
# definition path (jit) does not need the report, the artifact format or autograd,
# and a process that only loads artifacts never needs jit.
_LAZY = {
    "jit": ".frontends.jit",
    "PnexOp": ".op",
    "inspect": ".report",
    "build_report": ".report",
    "KernelReport": ".report",
    "save": ".artifact",
    "load": ".artifact",
    "profile": ".profiling",
    "KernelProfile": ".profiling",
    "attach_backward": ".autograd",
    "backward_of": ".autograd",
    "xoroshiro128p_states": ".random",
    "derive_backward": ".adjoint",
}
_SUBMODULES = frozenset({"autograd", "random", "tc"})


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


__all__ = [
    "jit",
    "In",
    "InMut",
    "Out",
    "Scalar",
    "Unused",
    "Tune",
    "Seed",
    "random",
    "tc",
    "xoroshiro128p_states",
    "vload",
    "vstore",
    "inspect",
    "build_report",
    "profile",
    "KernelProfile",
    "save",
    "load",
    "attach_backward",
    "backward_of",
    "derive_backward",
    "KernelReport",
    "PnexOp",
    "PnexError",
    "KernelDefinitionError",
    "ShapeExpressionError",
    "KernelTypingError",
    "KernelCompileError",
    "ArgumentTypeError",
    "ArgumentShapeError",
    "ArgumentValueError",
    "KernelLaunchError",
    "KernelIndexError",
    "ArtifactError",
    "jax_op",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def jax_op(op: "PnexOp"):
    """The JAX function of a pnex op: same arguments, scalars and outputs (then the new
    values of ``InMut`` arguments), eager and under ``jax.jit``, ``grad`` and ``vmap``;
    launched by XLA on a GPU, through the CUDA simulator elsewhere.  Imports JAX (the
    ``jax`` extra); see :mod:`pnex_magic.frontends.jax_op`."""
    from .frontends.jax_op import jax_op as _jax_op

    return _jax_op(op)


def load_ipython_extension(ipython) -> None:
    """``%load_ext pnex_magic``: register the ``%%pnex`` magics."""
    from .frontends.magic import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .frontends.magic import unload_ipython_extension as _unload

    _unload(ipython)
