"""The ``jit()`` decorator: the Python front end of the compiler core."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .definition import JitOptions, KernelDefinition
from .errors import KernelDefinitionError
from .op import PnexOp, make_op
from .spec import build_spec

__all__ = ["jit", "define"]


def define(fn: Callable, *, n_threads: Any, threads_per_block: Any, options: JitOptions, name: str | None = None) -> PnexOp:
    """Spec → compile check → op.  Shared by ``jit()`` and the ``%%pnex`` magic."""
    start = time.perf_counter()
    spec = build_spec(fn, n_threads=n_threads, threads_per_block=threads_per_block, name=name)
    definition = KernelDefinition(fn, spec, options)
    compiled = definition.check_compiles()
    op = make_op(definition)
    if options.verbose:
        print(f"pnex: {spec.python_signature()}")
        print(f"pnex: schema pnex::{definition.op_name}{spec.schema}")
        if compiled is None:
            print(f"pnex: not compiled ({definition.toolchain_error}); CPU tensors run in the simulator")
        else:
            how = "cache hit" if compiled.cache_hit else f"compiled in {compiled.compile_seconds:.2f} s"
            print(f"pnex: {compiled.arch}, {how}, key {compiled.key[:16]}")
            if compiled.resources is not None:
                r = compiled.resources
                print(
                    f"pnex: {r.registers} registers/thread, {r.shared_bytes} B shared, "
                    f"{r.local_bytes} B local, spills {r.spill_store_bytes}/{r.spill_load_bytes} B"
                )
        print(f"pnex: ready in {time.perf_counter() - start:.2f} s")
    return op


def jit(
    *,
    n_threads: str | int | tuple[str | int, ...],
    to_extension: bool = False,
    cache_id: str | None = None,
    verbose: bool = False,
    threads_per_block: int | tuple[int, ...] | None = None,
    max_registers: int | None = None,
    arch: str | None = None,
) -> Callable[[Callable[..., None]], PnexOp]:
    """Compile a Python function written as a Numba-CUDA kernel into a PyTorch operator.

    Every parameter is annotated with :class:`~pnex_magic.In`, :class:`~pnex_magic.InMut`,
    :class:`~pnex_magic.Out`, :class:`~pnex_magic.Scalar` (or a dtype such as ``float``) or
    :class:`~pnex_magic.Unused`.  The operator takes the ``In``/``InMut``/``Scalar``
    parameters as arguments, in declaration order, and returns the ``Out`` tensors
    (one as a tensor, several as a tuple, none as ``None``).

    Parameters
    ----------
    n_threads : str, int, or tuple of 2 or 3 of them
        Total threads per launch axis (X, Y, Z order), as expressions over the
        parameters, e.g. ``"a.numel()"`` or ``("out.size(1)", "out.size(0)")``.
        Blocks per grid are ``ceil(n_threads / threads_per_block)`` on each axis.
    to_extension : bool, default False
        Accepted for compatibility with pytorch-numba-extension-jit.  Both
        settings give the same operator; GPU calls go through pnex's C++ launcher
        whenever it can be built.
    cache_id : str, optional
        Name of the on-disk cache slot for this kernel.  Kernels sharing a
        ``cache_id`` evict each other (recompile), never serve each other's code.
    verbose : bool, default False
        Print the signature, schema, cache outcome and resource usage.
    threads_per_block : int or tuple, optional
        Block shape; defaults to 256, (16, 16) or (8, 8, 4) by dimensionality.
    max_registers : int, optional
        Cap on registers per thread (ptxas ``-maxrregcount``); excess spills to local memory.
    arch : str, optional
        Target architecture (``"sm_90"``); defaults to the current GPU's, else
        ``$PNEX_ARCH``, else ``sm_75``.  GPU launches always use the device's own.

    Returns
    -------
    decorator : (kernel) -> PnexOp
        A :class:`torch.library.CustomOpDef` subclass.

    Examples
    --------
    >>> import torch, pnex_magic as pnex
    >>> from numba import cuda
    >>> @pnex.jit(n_threads="a.numel()")
    ... def copy(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
    ...     x = cuda.grid(1)
    ...     if x < a.shape[0]:
    ...         result[x] = a[x]
    >>> copy(torch.arange(5, dtype=torch.float32))
    tensor([0., 1., 2., 3., 4.])
    """
    if max_registers is not None and (isinstance(max_registers, bool) or not isinstance(max_registers, int) or max_registers <= 0):
        raise KernelDefinitionError(f"max_registers must be a positive int, got {max_registers!r}")
    if cache_id is not None and not isinstance(cache_id, str):
        raise KernelDefinitionError(f"cache_id must be a string, got {cache_id!r}")
    options = JitOptions(
        to_extension=bool(to_extension),
        cache_id=cache_id,
        verbose=bool(verbose),
        max_registers=max_registers,
        arch=arch,
    )

    def decorator(fn: Callable[..., None]) -> PnexOp:
        return define(fn, n_threads=n_threads, threads_per_block=threads_per_block, options=options)

    return decorator
