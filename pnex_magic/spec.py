"""Parameter annotations and the kernel specification built from them.

``In``, ``InMut``, ``Out``, ``Scalar`` and ``Unused`` are what a user writes;
:func:`build_spec` turns an annotated function plus the launch options into an
immutable :class:`KernelSpec`, checking everything that can be checked before
compiling: annotations, dtypes, shape and ``n_threads`` expressions, launch
dimensions.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from .blocks import as_tuple, parse_autotune_key, parse_n_threads, parse_threads_per_block
from .dtypes import DType, resolve_dtype, supported_dtype_names
from .errors import KernelDefinitionError, ShapeExpressionError
from .expressions import Expr, NameInfo, Size, parse_expression

__all__ = [
    "In",
    "InMut",
    "Out",
    "Scalar",
    "Unused",
    "TensorParam",
    "ScalarParam",
    "UnusedParam",
    "KernelSpec",
    "build_spec",
]

ShapeSpec = "tuple[int | str | None, ...] | str"


class _TensorAnnotation:
    role = ""

    def __init__(self, dtype: Any, shape: Any):
        self.dtype = dtype
        self.shape = shape

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dtype!r}, {self.shape!r})"

    def __class_getitem__(cls, item):
        return cls(*item) if isinstance(item, tuple) else cls(item)


class In(_TensorAnnotation):
    """An input tensor the kernel only reads: ``param: In(dtype, shape)``.

    ``shape`` is the name of an earlier tensor parameter (same shape as that
    one) or a tuple with one entry per axis: an ``int`` (fixed size), ``None``
    (any size) or an expression string such as ``"a.size(0)"``, ``"n * 2"`` or a
    bare tensor name (that tensor's size on the same axis).
    """

    role = "in"


class InMut(_TensorAnnotation):
    """An input tensor the kernel may write: ``param: InMut(dtype, shape)``.

    Declared as mutated in the operator's schema, so ``torch.compile`` and
    autograd know about the write.  See :class:`In` for ``shape``.
    """

    role = "inmut"


class Out(_TensorAnnotation):
    """An output tensor, created by the operator and returned:
    ``param: Out(dtype, shape, init=None)``.

    Every axis must have a known size (an int or an expression; no ``None``).
    Without ``init`` the tensor is uninitialised (``torch.empty``); with it, it is
    filled with that value first (``init=0`` for accumulators and gradients).
    """

    role = "out"

    def __init__(self, dtype: Any, shape: Any, init: float | int | bool | None = None):
        super().__init__(dtype, shape)
        self.init = init

    def __repr__(self) -> str:
        init = "" if self.init is None else f", init={self.init!r}"
        return f"Out({self.dtype!r}, {self.shape!r}{init})"


class Scalar:
    """A scalar argument: ``param: Scalar(dtype)``, or the shorthand ``param: float``
    (float32), ``param: int`` (int64) or any dtype spelling."""

    def __init__(self, dtype: Any):
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"Scalar({self.dtype!r})"

    def __class_getitem__(cls, item):
        return cls(item)


class Unused:
    """A parameter the kernel does not use in this configuration.  It is dropped
    from the operator and passed to the kernel as ``None``; every use of it must be
    dead code.  Typical use: ``idx: Out("i64", "x") if with_indices else Unused``."""

    def __repr__(self) -> str:
        return "Unused"


@dataclasses.dataclass(frozen=True)
class TensorParam:
    name: str
    role: str  # "in", "inmut" or "out"
    dtype: DType
    shape: tuple[Expr | None, ...]  # None: free axis (inputs only)
    init: float | int | bool | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_input(self) -> bool:
        return self.role != "out"

    def shape_text(self) -> str:
        entries = ["None" if e is None else str(e) for e in self.shape]
        return "(" + ", ".join(entries) + ("," if len(entries) == 1 else "") + ")"

    def describe(self) -> str:
        kind = {"in": "In", "inmut": "InMut", "out": "Out"}[self.role]
        init = "" if self.init is None else f", init={self.init!r}"
        return f"{kind}({self.dtype.name}, {self.shape_text()}{init})"


@dataclasses.dataclass(frozen=True)
class ScalarParam:
    name: str
    dtype: DType
    role: str = "scalar"

    def describe(self) -> str:
        return f"Scalar({self.dtype.name})"


@dataclasses.dataclass(frozen=True)
class UnusedParam:
    name: str
    role: str = "unused"

    def describe(self) -> str:
        return "Unused"


Param = "TensorParam | ScalarParam | UnusedParam"


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Everything about a kernel's interface, independent of how it is compiled."""

    name: str
    qualname: str
    module: str
    params: tuple[TensorParam | ScalarParam | UnusedParam, ...]
    n_threads: tuple[Expr, ...]  # X, Y, Z order; 1 to 3 entries
    threads_per_block: tuple[int, ...]  # same length as n_threads; the default (first) candidate
    #: Autotune candidates, ``threads_per_block`` first; empty when the block is fixed.
    candidates: tuple[tuple[int, ...], ...] = ()
    #: Autotune key expressions over the arguments; ``None``: every input size, bucketed.
    autotune_key: tuple[Expr, ...] | None = None

    @property
    def autotuned(self) -> bool:
        """Whether the op picks its block among several candidates (see :mod:`pnex_magic.blocks`)."""
        return bool(self.candidates)

    @property
    def block_candidates(self) -> tuple[tuple[int, ...], ...]:
        """Every block shape the op may launch with, the default first."""
        return self.candidates or (self.threads_per_block,)

    def tuning_key(self) -> tuple[tuple[Expr, ...], bool]:
        """The autotune key's expressions and whether their values are bucketed to powers
        of two (the default key: every input tensor's size on every axis)."""
        if self.autotune_key is not None:
            return self.autotune_key, False
        sizes = tuple(Size(p.name, axis) for p in self.params if isinstance(p, TensorParam) and p.is_input
                      for axis in range(p.ndim))
        return sizes, True

    @property
    def arguments(self) -> tuple[TensorParam | ScalarParam, ...]:
        """The operator's arguments, in declaration order."""
        return tuple(p for p in self.params if p.role in ("in", "inmut", "scalar"))

    @property
    def outputs(self) -> tuple[TensorParam, ...]:
        return tuple(p for p in self.params if p.role == "out")

    def param(self, name: str) -> TensorParam | ScalarParam | UnusedParam:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def index_of(self, name: str) -> int:
        for i, p in enumerate(self.params):
            if p.name == name:
                return i
        raise KeyError(name)

    @property
    def schema(self) -> str:
        """The torch.library schema, without the operator's name."""
        args = []
        for p in self.arguments:
            if isinstance(p, ScalarParam):
                args.append(f"{p.dtype.schema_scalar} {p.name}")
            elif p.role == "inmut":
                args.append(f"Tensor({p.name}!) {p.name}")
            else:
                args.append(f"Tensor {p.name}")
        outs = self.outputs
        if not outs:
            ret = "()"
        elif len(outs) == 1:
            ret = "Tensor"
        else:
            ret = "(" + ", ".join("Tensor" for _ in outs) + ")"
        return f"({', '.join(args)}) -> {ret}"

    @property
    def mutated(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.role == "inmut")

    def python_signature(self) -> str:
        args = []
        for p in self.arguments:
            if isinstance(p, ScalarParam):
                args.append(f"{p.name}: {p.dtype.python_type.__name__}")
            else:
                args.append(f"{p.name}: Tensor[{p.dtype.name}, {p.shape_text()}]")
        outs = self.outputs
        if not outs:
            ret = "None"
        elif len(outs) == 1:
            ret = f"Tensor[{outs[0].dtype.name}, {outs[0].shape_text()}]"
        else:
            ret = "tuple[" + ", ".join(f"Tensor[{o.dtype.name}, {o.shape_text()}]" for o in outs) + "]"
        return f"{self.name}({', '.join(args)}) -> {ret}"

    def describe(self) -> str:
        """A canonical text of the interface, part of the cache key."""
        params = "; ".join(f"{p.name}: {p.describe()}" for p in self.params)
        text = (
            f"{self.module}.{self.qualname}({params}) "
            f"n_threads={tuple(map(str, self.n_threads))} tpb={self.threads_per_block}"
        )
        if self.autotuned:
            key = "default" if self.autotune_key is None else tuple(map(str, self.autotune_key))
            text += f" candidates={self.candidates} autotune_key={key}"
        return text


def _resolve_annotation(kernel: str, name: str, raw: Any, fn: Callable) -> Any:
    """Turn a (possibly string) annotation into an annotation object."""
    if not isinstance(raw, str):
        return raw
    if resolve_dtype(raw) is not None:  # the shorthand ``c: "f32"``
        return raw
    namespace = dict(fn.__globals__)
    if fn.__closure__:
        namespace.update(
            {
                var: cell.cell_contents
                for var, cell in zip(fn.__code__.co_freevars, fn.__closure__)
                if _cell_is_set(cell)
            }
        )
    try:
        return eval(raw, namespace)  # noqa: S307 -- an annotation, as typing.get_type_hints does
    except Exception as exc:
        raise KernelDefinitionError(
            f"kernel {kernel!r}, parameter {name!r}: cannot evaluate the annotation {raw!r} "
            f"({type(exc).__name__}: {exc}). With `from __future__ import annotations`, annotations "
            f"are strings evaluated in the kernel's module, so they cannot use local variables; "
            f"remove that import or define the names at module level"
        ) from None


def _cell_is_set(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def build_spec(
    fn: Callable,
    *,
    n_threads: Any,
    threads_per_block: Any = None,
    autotune_key: Any = None,
    name: str | None = None,
    signature: inspect.Signature | None = None,
) -> KernelSpec:
    """Check ``fn``'s annotations and the launch options (:mod:`pnex_magic.blocks`);
    return its :class:`KernelSpec`."""
    kernel = name or getattr(fn, "__name__", "kernel")
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise KernelDefinitionError(f"jit() expects a Python function, got {fn!r}")
    sig = signature or inspect.signature(fn)
    if signature is not None:
        # A Signature keeps one parameter per name (duplicates collapse silently), and the
        # kernel is compiled and launched in the function's own parameter order: a given
        # signature must list exactly the function's parameters, in that order.
        given = list(signature.parameters)
        own = list(inspect.signature(fn).parameters)
        if given != own:
            raise KernelDefinitionError(
                f"kernel {kernel!r}: the signature given lists parameters ({', '.join(given)}) but the "
                f"function's are ({', '.join(own)}); each parameter must appear once, in the function's order"
            )
    annotations = dict(getattr(fn, "__annotations__", {}))
    ret = annotations.pop("return", None)
    if ret not in (None, "None"):
        raise KernelDefinitionError(f"kernel {kernel!r} is annotated to return {ret!r}; kernels return nothing")

    params: list[TensorParam | ScalarParam | UnusedParam] = []
    visible: dict[str, NameInfo] = {}
    seen: set[str] = set()
    for pname, parameter in sig.parameters.items():
        where = f"kernel {kernel!r}, parameter {pname!r}"
        if parameter.name in seen:
            raise KernelDefinitionError(f"{where}: duplicate parameter name")
        seen.add(parameter.name)
        if parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            raise KernelDefinitionError(f"{where}: kernels take plain positional parameters, not {parameter.kind.description}")
        if pname not in annotations:
            raise KernelDefinitionError(
                f"{where} has no annotation; annotate it with In(dtype, shape), InMut(...), Out(...), "
                f"Scalar(dtype) (or a dtype such as float), or Unused"
            )
        ann = _resolve_annotation(kernel, pname, annotations[pname], fn)
        if ann is Unused or isinstance(ann, Unused):
            params.append(UnusedParam(pname))
            continue
        if isinstance(ann, type) and issubclass(ann, _TensorAnnotation):
            raise KernelDefinitionError(f"{where}: {ann.__name__} needs a dtype and a shape, e.g. {ann.__name__}('f32', (None,))")
        if isinstance(ann, _TensorAnnotation):
            dtype = _dtype(where, ann.dtype)
            shape = _shape(where, ann, visible)
            init = getattr(ann, "init", None)
            if init is not None and (isinstance(init, bool) or not isinstance(init, (int, float))):
                if not (dtype.name == "bool" and isinstance(init, bool)):
                    raise KernelDefinitionError(f"{where}: init must be a number, got {init!r}")
            if init is not None:
                _check_init(where, init, dtype)
            params.append(TensorParam(pname, ann.role, dtype, shape, init))
            visible[pname] = NameInfo("tensor", ndim=len(shape))
            continue
        if isinstance(ann, Scalar):
            dtype = _dtype(where, ann.dtype)
        elif resolve_dtype(ann) is not None:
            dtype = resolve_dtype(ann)
        else:
            raise KernelDefinitionError(
                f"{where}: {ann!r} is not a pnex annotation; expected In(dtype, shape), InMut(dtype, shape), "
                f"Out(dtype, shape[, init]), Scalar(dtype), a dtype such as float or 'f32', or Unused"
            )
        params.append(ScalarParam(pname, dtype))
        visible[pname] = NameInfo("scalar", integral=not dtype.is_floating_point and dtype.name != "bool")

    for pname in annotations:
        if pname not in sig.parameters:
            raise KernelDefinitionError(f"kernel {kernel!r}: annotation for {pname!r}, which is not a parameter")

    nt = parse_n_threads(kernel, n_threads)
    candidates = parse_threads_per_block(kernel, threads_per_block, len(nt))
    thread_exprs = tuple(
        parse_expression(e, visible, where=f"kernel {kernel!r}, n_threads[{i}]") for i, e in enumerate(nt)
    )
    arguments = {p.name: visible[p.name] for p in params if p.role in ("in", "inmut", "scalar")}
    key = parse_autotune_key(kernel, autotune_key, arguments, autotuned=len(candidates) > 1)
    return KernelSpec(
        name=kernel,
        qualname=getattr(fn, "__qualname__", kernel),
        module=getattr(fn, "__module__", None) or "__main__",
        params=tuple(params),
        n_threads=thread_exprs,
        threads_per_block=candidates[0],
        candidates=candidates if len(candidates) > 1 else (),
        autotune_key=key,
    )


def _check_init(where: str, init: float | int | bool, dtype: DType) -> None:
    """``init`` must be storable in ``dtype``: every call fills the output with it."""
    import math

    import torch

    integral = not dtype.is_floating_point and dtype.name != "bool"
    if integral and isinstance(init, float) and not (math.isfinite(init) and init.is_integer()):
        raise KernelDefinitionError(f"{where}: init={init!r} is not an integer, but the tensor's dtype is {dtype.name}")
    try:
        torch.full((), init, dtype=dtype.torch)
    except (RuntimeError, OverflowError):
        raise KernelDefinitionError(f"{where}: init={init!r} does not fit in the tensor's dtype, {dtype.name}") from None


def _dtype(where: str, spelling: Any) -> DType:
    dtype = resolve_dtype(spelling)
    if dtype is None:
        raise KernelDefinitionError(
            f"{where}: unknown dtype {spelling!r}; expected one of {', '.join(supported_dtype_names())} "
            f"(as torch.float32, 'float32', 'f32', numpy dtypes, float, int or bool)"
        )
    return dtype


def _shape(where: str, ann: _TensorAnnotation, visible: dict[str, NameInfo]) -> tuple[Expr | None, ...]:
    shape = ann.shape
    tensors = {n: info for n, info in visible.items() if info.kind == "tensor"}
    if isinstance(shape, str):
        info = tensors.get(shape)
        if info is None:
            earlier = ", ".join(tensors) or "none"
            if shape in visible:
                problem = f"{shape!r} is a scalar"
            else:
                problem = f"{shape!r} is not an earlier tensor parameter"
            raise ShapeExpressionError(
                f"{where}: shape {shape!r} means 'same shape as {shape}', but {problem} "
                f"(earlier tensor parameters: {earlier})"
            )
        return tuple(Size(shape, axis) for axis in range(info.ndim))
    entries = as_tuple(shape)
    if entries is None:
        if isinstance(shape, int) and not isinstance(shape, bool):
            entries = (shape,)
        else:
            raise ShapeExpressionError(
                f"{where}: shape must be a tuple of int/str/None or the name of an earlier tensor, got {shape!r}"
            )
    result: list[Expr | None] = []
    for axis, entry in enumerate(entries):
        at = f"{where}, shape[{axis}]"
        if entry is None:
            if ann.role == "out":
                raise ShapeExpressionError(
                    f"{at}: an Out tensor needs a known size on every axis; None (any size) is only for inputs. "
                    f"Give an int or an expression such as 'a.size({axis})'"
                )
            result.append(None)
            continue
        expr = parse_expression(entry, visible, where=at, axis=axis)
        if isinstance(entry, int) and entry < 0:
            raise ShapeExpressionError(f"{at}: a size cannot be negative, got {entry}")
        result.append(expr)
    return tuple(result)
