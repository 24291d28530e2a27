"""The ``jit()`` decorator: the Python front end.  It only turns its keyword
options into :class:`~pnex_magic.definition.JitOptions` and calls the core
(:func:`pnex_magic.define.definition`, then :func:`pnex_magic.define.registered`)."""

from __future__ import annotations

from collections.abc import Callable

from ..define import definition, registered
from ..definition import JitOptions
from ..errors import KernelDefinitionError
from ..op import PnexOp

__all__ = ["jit", "attach_derived_backward"]


def jit(
    *,
    n_threads: str | int | tuple[str | int, ...],
    to_extension: bool = False,
    cache_id: str | None = None,
    cache: bool = True,
    verbose: bool = False,
    threads_per_block: int | tuple[int, ...] | str | list[int | tuple[int, ...]] | None = None,
    max_registers: int | None = None,
    arch: str | None = None,
    autotune_key: str | tuple[str, ...] | None = None,
    check: bool | None = None,
    backward: str | None = None,
    flops: str | int | None = None,
    shared_bytes: int | str = 0,
    cluster_dims: int | tuple[int, ...] | None = None,
    requires: str | list[str] | tuple[str, ...] | dict[str, str] | None = None,
    tune_requires: str | list[str] | tuple[str, ...] | dict[str, str] | None = None,
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
    cache : bool, default True
        ``False``: nothing of this kernel is read from or written to pnex's cache
        folder (``$PNEX_CACHE_DIR``): not its builds, its simulated form, its autotune
        choices (timed again in each process) or its SASS listing.  It is compiled in
        every process that defines it.  The C++ launcher's build is the environment's
        and is still kept.
    verbose : bool, default False
        Print the signature, schema, cache outcome and resource usage.
    threads_per_block : int, tuple, "auto" or list, optional
        Block shape; defaults to 256, (16, 16) or (8, 8, 4) by dimensionality.
        ``"auto"`` or a list of candidates (``[128, 256, 512]``, ``[(32, 8), (16, 16)]``)
        autotunes: the first GPU call of each key times every candidate that fits the
        kernel's limits and keeps the fastest (stored on disk per GPU model); the
        first candidate is the default (CPU simulator, CUDA-graph capture,
        ``torch.compile``'d code, ``PNEX_AUTOTUNE=0``).  Autotune only varies what
        you allow: a kernel whose results depend on its block shape (a
        ``cuda.shared.array`` sized for one block) must pin it.  See
        :mod:`pnex_magic.blocks`.
    max_registers : int, optional
        Cap on registers per thread (ptxas ``-maxrregcount``); excess spills to local memory.
    arch : str, optional
        Target architecture (``"sm_90"``); defaults to the current GPU's, else
        ``$PNEX_ARCH``, else ``sm_75``.  GPU launches always use the device's own.
    autotune_key : str or tuple of str, optional
        With autotuning: expressions over the op's arguments (``"a.size(0)"``, ``"n"``)
        whose values pick the tuned block; calls with equal values share it.  Default:
        every input tensor's size, rounded up to a power of two.
    check : bool, optional
        Checked launches: every array access of the kernel is tested against its
        array's shape on the GPU; an access out of bounds is not made, and the call
        raises :class:`~pnex_magic.KernelIndexError` (an ``IndexError``) naming the
        array, index, shape, thread, block and line, with the CUDA context intact.
        Costs a synchronisation per call and some device time; not in CUDA graphs.
        Default: ``$PNEX_CHECK == "1"``.
    backward : "auto", optional
        ``"auto"``: derive the backward kernel from this kernel's source and attach it
        (:func:`pnex_magic.derive_backward`, :func:`pnex_magic.attach_backward`), so that
        autograd, ``torch.compile`` and ``opcheck`` differentiate the op.  Gradients flow
        to every floating-point ``In`` tensor; ``Scalar`` parameters get none.  What the
        transform does not differentiate exactly is a ``KernelDefinitionError`` naming
        the line (docs/gradients.md, "Derived gradients").
    flops : str or int, optional
        The floating-point operations of one call, as an expression over the
        parameters in the language of ``n_threads`` (``"2 * a.size(0) * b.size(1) *
        a.size(1)"``, ``"2 * M * N * K"`` with integer scalars ``M``, ``N``, ``K``;
        ``Tune`` values too): the report then gives the op's TFLOP/s and its share of
        the GPU's compute peak (the tensor cores' where the kernel uses them).  Without
        it, the count is inferred from the PTX of a kernel without loops, and the
        report says so.
    shared_bytes : int or str, default 0
        Bytes of dynamic shared memory per block, which the kernel declares with
        Numba's idiom ``smem = cuda.shared.array(0, dtype)`` (every such array aliases
        the same bytes; carve tiles from it by slicing and ``.reshape``).  Static
        ``cuda.shared.array`` is capped at 48 KiB per block; dynamic shared memory goes
        up to what the GPU allows (227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on
        sm_86/sm_89).  An int, or an expression over ``Tune`` parameters and integer
        constants (``+ - * // % min max``), evaluated per ``Tune`` variant:
        ``"STAGES * (BM + BN) * 64 * 2"``.  It may not depend on the call's sizes.
    cluster_dims : int or tuple of up to 3 ints, optional
        Thread-block clusters (sm_90: H100, H200), CUDA's ``__cluster_dims__``: the
        grid's blocks are grouped ``x * y * z`` at a time (8 at most), each group run at
        once on neighbouring SMs, where the ``pnex.tc`` cluster primitives reach each
        other's shared memory and barriers (``cluster_ctarank``, ``cluster_sync``,
        ``mbarrier_arrive_cluster``, ``tma_load_multicast``).  The code declares the shape
        (``.reqnctapercluster``), so a launch needs nothing else, but its grid must be a
        whole number of clusters on every axis: a call whose grid is not is refused,
        naming both.  Refused for GPUs before sm_90.  The CPU simulator runs a cluster's
        blocks at once.
    requires : str, list of str, or dict, optional
        Rules the call's arguments must keep, for a kernel that is right only for some
        values of its scalars or sizes: conditions over the op's arguments, in the
        language of ``n_threads`` compared with ``< <= > >= == !=`` and combined with
        ``and``/``or``/``not``, e.g. ``["0 <= steps <= 15", "x.size(0) % 128 == 0"]``.
        Every launcher (eager, the C++ launcher, ``torch.compile``, the CPU simulator,
        JAX, a saved artifact) refuses a call that breaks one with
        :class:`~pnex_magic.ArgumentValueError` naming the rule and the values, instead
        of computing wrong numbers.  ``Tune`` parameters (see ``tune_requires``) and
        outputs may not appear.
        A dict maps each condition to what it means, which ends the message:
        ``{"a.size(1) % 64 == 0": "K must be a multiple of the k-tile, 64"}``.
        See :mod:`pnex_magic.conditions`.
    tune_requires : str, list of str, or dict, optional
        Rules over the ``Tune`` parameters, in the same language.  A rule over them
        alone keeps the combinations of choices that hold: only those are compiled,
        timed and saved, e.g. ``"STAGES * (BM + BN) * 64 * 2 <= 232448"`` keeps the tile
        shapes whose buffers fit in shared memory (``Tune`` alone can only drop a choice
        of one parameter from every combination).  The first combination kept is the
        default.  A rule that also names the call's arguments, e.g. ``"w.size(0) % BN ==
        0"``, chooses per call: each call launches (and the autotuner times) only the
        combinations it keeps, the first of them untuned, and a call that keeps none is
        refused with :class:`~pnex_magic.ArgumentValueError`.  A rule that names no
        ``Tune`` parameter or an output, divides by zero, or keeps no combination is
        refused at definition.

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
    options = JitOptions.checked(
        to_extension=to_extension, cache_id=cache_id, verbose=verbose, max_registers=max_registers, arch=arch,
        check=check, use_cache=cache,
    )

    if backward not in (None, "auto"):
        raise KernelDefinitionError(
            f"jit(backward={backward!r}): the only value is 'auto' (derive the backward from the kernel's source); "
            f"attach a hand-written backward with pnex.attach_backward or @pnex.backward_of"
        )

    def decorator(fn: Callable[..., None]) -> PnexOp:
        d = definition(
            fn, n_threads=n_threads, threads_per_block=threads_per_block, autotune_key=autotune_key, options=options,
            flops=flops,
            shared_bytes=shared_bytes, cluster_dims=cluster_dims, requires=requires, tune_requires=tune_requires,
        )
        with registered(d) as op:  # a backward that cannot be derived leaves the previous definition
            if backward == "auto":
                attach_derived_backward(op)
        return op

    return decorator


def attach_derived_backward(op: PnexOp) -> PnexOp:
    """Derive ``op``'s backward from its kernel's source and attach it
    (:func:`pnex_magic.adjoint.attach_derived_backward`): ``backward="auto"`` and
    ``%%pnex --backward auto``.  Returns the backward op."""
    # lazy: the transform's modules (60 ms of imports) load only for kernels that ask for it
    from ..adjoint import attach_derived_backward as attach

    return attach(op)
