"""Gradients without a backward kernel: pnex derives the adjoint kernel from the forward
kernel's source (reverse mode by source transformation, per thread, as NVIDIA Warp does).

``@pnex.jit(..., backward="auto")`` and ``%%pnex ... --backward auto`` attach the derived
backward; :func:`derive_backward` returns it without attaching it.  It is an ordinary
pnex op (cached like any compile, shown by the report, ``op.backward_source`` on the
forward op), attached with :func:`pnex_magic.autograd.attach_backward`.

One room per concern:

==========================  ===========================================================
module                      what it holds
==========================  ===========================================================
:mod:`.rules`               the derivative rules: one table, one entry per operation
:mod:`.ir`                  the forward kernel as statements over SSA values
:mod:`.values`              names and expressions: types, activity, what is refused
:mod:`.program`             the walk from the forward's source to those statements
:mod:`.ownership`           plain stores where each element is the thread's own,
                            atomics where threads share (the checked pass's proofs)
:mod:`.emit`                the backward's body: forward replay, then reverse pass
:mod:`.derive`              its source, signature and definition
==========================  ===========================================================
"""

from __future__ import annotations

from typing import Any

from ..autograd import attach_backward
from ..define import registered
from ..definition import KernelDefinition
from ..errors import KernelDefinitionError
from ..op import PnexOp
from .derive import SUFFIX, DerivedKernel, derive_kernel

__all__ = ["derive_backward", "attach_derived_backward", "derive_kernel", "DerivedKernel", "SUFFIX"]


def _forward(op: Any) -> KernelDefinition:
    definition = getattr(op, "definition", None) if isinstance(op, PnexOp) else None
    if not isinstance(definition, KernelDefinition):
        what = "a pnex op loaded from a saved artifact (it has no Python source)" if isinstance(op, PnexOp) else repr(op)
        raise KernelDefinitionError(
            f"derive_backward() derives the backward of an op made by pnex.jit or %%pnex, from its kernel's Python "
            f"source; got {what}")
    return definition


def derive_backward(op: PnexOp) -> PnexOp:
    """The backward of ``op``, derived from its kernel's source, as a pnex op (not attached).

    Its parameters are the forward's ``In`` tensors and scalars, ``grad_<out>`` for each
    floating-point ``Out``, and it returns ``grad_<in>`` for each floating-point ``In``
    tensor, the naming :func:`~pnex_magic.autograd.attach_backward` wires by.  Its source
    is ``inspect.getsource(bwd.definition.fn)`` (and the forward's ``backward_source`` once
    attached).  ``Scalar`` parameters get no gradient; integer outputs have none.

    Raises
    ------
    KernelDefinitionError
        What the transform does not differentiate exactly, naming the line: ``InMut``,
        shared memory, atomics or ``syncthreads`` in the forward, ``while``, ``break``,
        ``continue``, calls of device functions, reads of outputs, a loop whose
        derivative needs a value carried between its trips, ...

    Examples
    --------
    >>> import math, torch, pnex_magic as pnex
    >>> from numba import cuda
    >>> @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    ... def soft(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    ...     i = cuda.grid(1)
    ...     if i < x.shape[0]:
    ...         y[i] = math.log1p(math.exp(x[i]))
    >>> bwd = pnex.derive_backward(soft)
    >>> bwd.spec.python_signature()
    'soft_adjoint(x: Tensor[float64, (None,)], grad_y: Tensor[float64, (x.size(0),)]) -> Tensor[float64, (x.size(0),)]'
    """
    forward = _forward(op)
    derived = derive_kernel(forward.fn, forward.spec)
    options = forward.options
    cache_id = None if options.cache_id is None else f"{options.cache_id}{SUFFIX}"
    options = type(options)(**{**options.__dict__, "cache_id": cache_id})
    with registered(derived.definition(options)) as backward:
        pass
    return backward


def attach_derived_backward(op: PnexOp) -> PnexOp:
    """Derive ``op``'s backward (:func:`derive_backward`) and attach it (what
    ``backward="auto"`` does); returns the backward op."""
    backward = derive_backward(op)
    attach_backward(op, backward)
    return backward
