"""pnex_magic: write a custom GPU kernel for PyTorch from a notebook.

A Python function written as a Numba-CUDA kernel, its parameters annotated
``In``, ``InMut``, ``Out``, ``Scalar`` or ``Unused`` (and compile-time constants
``Tune``, chosen by the autotuner), becomes a PyTorch custom
operator with :func:`jit` (or the ``%%pnex`` cell magic: ``%load_ext pnex_magic``).
The operator works eagerly, under ``torch.compile(fullgraph=True)`` and in CUDA
graphs; on CPU tensors it runs through numba-cuda's CUDA simulator.
:func:`inspect` reports the schema, PTX and resource usage without a GPU.
:func:`jax_op` makes the same op a JAX function (``jax.jit``, ``grad``, ``vmap``);
JAX is imported only then.
:func:`save` writes an op as one self-contained file that :func:`load` registers
again in a process with torch alone (no Numba, no CUDA compiler).
"""

from __future__ import annotations

from ._version import __version__
from . import autograd
from .autograd import attach_backward, backward_of
from .artifact import load, save
from .errors import (
    ArgumentShapeError,
    ArgumentTypeError,
    ArtifactError,
    KernelCompileError,
    KernelDefinitionError,
    KernelIndexError,
    KernelLaunchError,
    KernelTypingError,
    PnexError,
    ShapeExpressionError,
)
from .frontends.jit import jit
from .op import PnexOp
from .report import KernelReport, build_report, inspect
from .spec import In, InMut, Out, Scalar, Tune, Unused

__all__ = [
    "jit",
    "In",
    "InMut",
    "Out",
    "Scalar",
    "Unused",
    "Tune",
    "inspect",
    "build_report",
    "save",
    "load",
    "attach_backward",
    "backward_of",
    "KernelReport",
    "PnexOp",
    "PnexError",
    "KernelDefinitionError",
    "ShapeExpressionError",
    "KernelTypingError",
    "KernelCompileError",
    "ArgumentTypeError",
    "ArgumentShapeError",
    "KernelLaunchError",
    "KernelIndexError",
    "ArtifactError",
    "jax_op",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def jax_op(op: PnexOp):
    """The JAX function of a pnex op: same arguments, scalars and outputs (then the new
    values of ``InMut`` arguments), eager and under ``jax.jit``, ``grad`` and ``vmap``;
    launched by XLA on a GPU, through the CUDA simulator elsewhere.  Imports JAX (the
    ``jax`` extra); see :mod:`pnex_magic.frontends.jax`."""
    from .frontends.jax import jax_op as _jax_op

    return _jax_op(op)


def load_ipython_extension(ipython) -> None:
    """``%load_ext pnex_magic``: register the ``%%pnex`` magics."""
    from .frontends.magic import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .frontends.magic import unload_ipython_extension as _unload

    _unload(ipython)
