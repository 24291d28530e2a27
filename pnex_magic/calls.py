"""Calls against a spec: concrete (or fake) arguments checked against a kernel's
interface, its output shapes and its launch grid.

Everything here evaluates the spec's shape and ``n_threads`` expressions on the
arguments of one call; it runs on real tensors (eager calls, the simulator), on
fake tensors with symbolic sizes (``torch.compile``'s fake implementation), on
example arguments before an op is registered (the ``%%pnex`` magic) and on the
static shapes of a JAX trace.  The C++ launcher runs the same checks, compiled to
postfix programs (:mod:`pnex_magic.launch.description`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .clusters import grid_problem
from .conditions import check_requirements
from .errors import ArgumentShapeError, ArgumentTypeError
from .spec import KernelSpec, ScalarParam, TensorParam

__all__ = [
    "LaunchInfo",
    "bind_arguments",
    "check_arguments",
    "output_shapes",
    "launch_grid",
    "launch_info",
    "format_shape",
    "has_internal_overlap",
    "overlaps",
    "internal_overlap_message",
    "alias_message",
    "inmut_grad_error",
    "record_layout_ok",
    "record_message",
]


def format_shape(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def bind_arguments(spec: KernelSpec, args: Sequence[Any]) -> dict[str, Any]:
    """``{parameter name: value}`` for the op's arguments, in declaration order, and the
    ``Tune`` parameters' first choices (a launch sets its variant's with
    :func:`tune_values`).  Trailing scalars left out take their defaults: torch's
    dispatcher drops arguments equal to their schema default before it calls a Python
    implementation."""
    env = {p.name: v for p, v in zip(spec.arguments, args)}
    for p in spec.arguments[len(args):]:
        if isinstance(p, ScalarParam) and p.has_default:
            env[p.name] = p.default
    if spec.tune_params:
        env.update(spec.tune_values(0))
    return env


def check_arguments(spec: KernelSpec, env: Mapping[str, Any]) -> torch.device | None:
    """Check every tensor argument's dtype, rank, sizes and device against the spec, and
    the arguments against the kernel's ``requires`` rules; returns the common device
    (``None`` if there are no tensor arguments)."""
    device: torch.device | None = None
    first: str | None = None
    for p in spec.arguments:
        if not isinstance(p, TensorParam):
            continue
        t = env[p.name]
        if t.dtype != p.dtype.torch:
            raise ArgumentTypeError(
                f"{spec.name}(): argument {p.name!r} must be a {p.dtype.name} tensor, got {str(t.dtype).removeprefix('torch.')}"
            )
        if p.dtype.is_record:
            if not record_layout_ok(p, t):
                raise ArgumentShapeError(record_message(spec, p) + f", got shape {format_shape(t.shape)} with "
                                         f"strides {format_shape(t.stride())}")
        elif t.dim() != p.ndim:
            raise ArgumentShapeError(
                f"{spec.name}(): argument {p.name!r} must have {p.ndim} dimension(s) {p.shape_text()}, "
                f"got {t.dim()} with shape {format_shape(t.shape)}"
            )
        if device is None:
            device, first = t.device, p.name
        elif t.device != device:
            raise ArgumentTypeError(
                f"{spec.name}(): argument {p.name!r} is on {t.device} but {first!r} is on {device}; "
                f"all tensor arguments must be on one device"
            )
    for p in spec.arguments:
        if not isinstance(p, TensorParam):
            continue
        t = env[p.name]
        for axis, expr in enumerate(p.shape):
            if expr is None:
                continue
            expected = expr.evaluate(env)
            if t.shape[axis] != expected:
                raise ArgumentShapeError(
                    f"{spec.name}(): argument {p.name!r} must have size {expr} = {expected} on axis {axis}, "
                    f"got {t.shape[axis]} (shape {format_shape(t.shape)})"
                )
    for name in spec.mutated:
        if has_internal_overlap(env[name]):
            raise ArgumentShapeError(internal_overlap_message(spec, name))
    for written, other in spec.overlap_checks:
        if overlaps(env[written], env[other]):
            raise ArgumentShapeError(alias_message(spec, written, other))
    check_requirements(spec.name, spec.checked_requires, env)  # jit(requires=...), and tune_requires per call
    return device


def record_layout_ok(p: TensorParam, t: torch.Tensor) -> bool:
    """Whether ``t`` holds ``p``'s records (:attr:`~pnex_magic.dtypes.DType.lanes`
    words each, two or more, on its last, dense axis)."""
    return t.dim() == p.storage_ndim and t.shape[-1] == p.dtype.lanes and t.stride(-1) == 1


def record_message(spec: KernelSpec, p: TensorParam) -> str:
    """What a tensor of record dtype must be (the Python and C++ launchers' message)."""
    shape = ", ".join(["n"] * p.ndim + [str(p.dtype.lanes)])
    return (
        f"{spec.name}(): argument {p.name!r} holds {p.dtype.name} states ({p.describe()}): a ({shape}) "
        f"{p.dtype.torch} tensor whose last axis is dense, the {p.dtype.lanes} words of each state, as "
        f"pnex.xoroshiro128p_states(n, seed, device) makes it"
    )


# The two memory checks torch's in-place operators make (ATen's MemoryOverlap.h), in
# Python so that they also run on fake tensors under torch.compile; the C++ launcher
# calls ATen's own (at::has_internal_overlap, at::get_overlap_status) with the same messages.


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether several elements of ``t`` share one memory location (a stride-0 axis of
    size > 1, as ``expand()`` makes): ATen's ``MemOverlap::Yes``."""
    return any(size > 1 and stride == 0 for size, stride in zip(t.shape, t.stride()))


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n != 1), key=lambda e: e[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share memory: ATen's ``MemOverlapStatus`` ``Full`` (the
    same tensor) or ``Partial`` (views of one storage whose elements intersect).  As in
    ATen, views that are not dense (``x[::2]`` and ``x[1::2]``) are not judged."""
    if a is b:
        return True
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage()._cdata != b.untyped_storage()._cdata:
        return False
    if not (_non_overlapping_and_dense(a) and _non_overlapping_and_dense(b)):
        return False
    a_begin, b_begin = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
    return bool(a_begin < b_end and b_begin < a_end)


def internal_overlap_message(spec: KernelSpec, name: str) -> str:
    return (
        f"{spec.name}(): argument {name!r} is written by the kernel (InMut), but more than one of its elements "
        f"refers to a single memory location (a stride-0 axis, as expand() makes), so threads would race on "
        f"them. Pass a tensor that owns its elements, e.g. {name}.clone()"
    )


def alias_message(spec: KernelSpec, written: str, other: str) -> str:
    kind = spec.param(other).describe().split("(")[0]
    reads = "writes it too" if kind == "InMut" else "reads it"
    return (
        f"{spec.name}(): arguments {written!r} (InMut) and {other!r} ({kind}) share memory (the same tensor, or "
        f"overlapping views of one): the kernel writes {written!r} while it {reads}, so threads would race. "
        f"Pass separate tensors (e.g. {other}.clone()), or, if the kernel is written for it, declare the "
        f"aliasing allowed: {written}: InMut(..., may_alias={other!r})"
    )


def inmut_grad_error(kernel: str, name: str, leaf: bool) -> ArgumentTypeError:
    """The error for an ``InMut`` argument ``name`` that requires grad while grad mode
    is on.  Every launcher raises it at the Autograd dispatch key, before the kernel
    runs (the C++ launcher calls this function for it, so the message is one)."""
    if leaf:
        why = (
            "it is a leaf tensor that requires grad, which torch's own in-place operations refuse: autograd "
            "cannot see the kernel's writes"
        )
    else:
        why = (
            f"it requires grad (it was computed from tensors that do), and autograd cannot see the kernel's "
            f"writes, so gradients through {name!r} would silently be wrong"
        )
    return ArgumentTypeError(
        f"{kernel}(): argument {name!r} is written in place by the kernel (InMut) while grad mode is on, but {why}. "
        f"Call the op under torch.no_grad() (or torch.inference_mode()), e.g. to update a buffer; to "
        f"differentiate through the kernel, write a functional kernel instead: {name} as an Out that the op "
        f"returns, with a backward attached (pnex.attach_backward)"
    )


def output_shapes(spec: KernelSpec, env: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The shape of every ``Out`` tensor, in declaration order."""
    shapes = []
    for p in spec.outputs:
        shape = tuple(expr.evaluate(env) for expr in p.shape)
        for axis, size in enumerate(shape):
            if isinstance(size, int) and size < 0:
                raise ArgumentShapeError(
                    f"{spec.name}(): output {p.name!r} would have size {p.shape[axis]} = {size} on axis {axis}; "
                    f"sizes cannot be negative"
                )
        shapes.append(shape)
    return shapes


def launch_grid(
    spec: KernelSpec, env: Mapping[str, Any], block: Sequence[int] | None = None
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(blocks per grid, threads per block), both padded to three axes.  ``env``
    holds the arguments, the outputs and the ``Tune`` values of the variant launched;
    ``block`` is the block shape to launch with (default: the spec's first candidate).
    A grid that is not a whole number of the kernel's clusters (``cluster_dims``) is an
    ``ArgumentShapeError`` naming both."""
    shape = tuple(block) if block is not None else spec.threads_per_block
    grid = []
    for axis, (expr, tpb) in enumerate(zip(spec.n_threads, shape, strict=True)):
        n = int(expr.evaluate(env))
        if n < 0:
            tuned = sorted(expr.names() & {p.name for p in spec.tune_params})
            with_tune = (
                f" with the Tune choice {', '.join(f'{t}={env[t]!r}' for t in tuned)}" if tuned else ""
            )
            raise ArgumentShapeError(
                f"{spec.name}(): n_threads[{axis}] = {expr} evaluates to {n}{with_tune}, which is negative"
            )
        grid.append(-(-n // tpb))
    block = list(shape)
    while len(grid) < 3:
        grid.append(1)
        block.append(1)
    problem = grid_problem(spec.name, grid, spec.cluster_dims) if all(grid) else None
    if problem is not None:  # (the C++ launcher says the same: csrc/launcher_call.cpp)
        raise ArgumentShapeError(problem)
    return (grid[0], grid[1], grid[2]), (block[0], block[1], block[2])


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What one call launches: ``n_threads`` evaluated, and the grid and block."""

    n_threads: tuple[int, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]

    @property
    def threads(self) -> int:
        """Threads launched (the grid times the block)."""
        g, b = self.grid, self.block
        return g[0] * g[1] * g[2] * b[0] * b[1] * b[2]


def launch_info(
    spec: KernelSpec, args: Sequence[Any], block: Sequence[int] | None = None, variant: int = 0
) -> LaunchInfo:
    """Check ``args`` (the op's arguments, positionally) against the spec without
    running anything, and say what a call on them launches (with ``block``, default
    the spec's first candidate, and the ``Tune`` values of ``variant``)."""
    missing = spec.arguments[len(args):]
    if missing and all(isinstance(p, ScalarParam) and p.has_default for p in missing):
        args = (*args, *(p.default for p in missing))  # the defaults of trailing scalars
    if len(args) != len(spec.arguments):
        names = ", ".join(p.name for p in spec.arguments)
        raise ArgumentTypeError(
            f"{spec.name}() takes {len(spec.arguments)} argument(s) ({names}) but {len(args)} were given"
        )
    env = bind_arguments(spec, args)
    for p in spec.arguments:
        if isinstance(p, TensorParam) and not isinstance(env[p.name], torch.Tensor):
            raise ArgumentTypeError(
                f"{spec.name}(): argument {p.name!r} must be a torch.Tensor, got {type(env[p.name]).__name__}"
            )
        if isinstance(p, ScalarParam) and isinstance(env[p.name], torch.Tensor):
            raise ArgumentTypeError(
                f"{spec.name}(): argument {p.name!r} must be a Python {p.dtype.python_type.__name__}, got a tensor"
            )
    check_arguments(spec, env)
    shapes = output_shapes(spec, env)
    for p, shape in zip(spec.outputs, shapes, strict=True):
        env[p.name] = torch.empty(shape, device="meta")
    env.update(spec.tune_values(variant))
    values = tuple(int(e.evaluate(env)) for e in spec.n_threads)
    grid, block3 = launch_grid(spec, env, block)
    return LaunchInfo(values, grid, block3, tuple(tuple(int(s) for s in shape) for shape in shapes))
