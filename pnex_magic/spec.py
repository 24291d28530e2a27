"""The kernel specification built from a function's parameter annotations.

``In``, ``InMut``, ``Out``, ``Scalar``, ``Unused`` and ``Tune``
(:mod:`pnex_magic.annotations`) are what a user writes; :func:`build_spec` turns an annotated function plus the
launch options into an immutable :class:`KernelSpec`, checking everything that can
be checked before compiling: annotations, dtypes, scalar defaults, shape and
``n_threads`` expressions, launch dimensions, and that the kernel writes something.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
from collections.abc import Callable
from typing import Any

from .annotations import In, InMut, Out, Scalar, TensorAnnotation, Tune, Unused
from .blocks import as_tuple, parse_autotune_key, parse_n_threads, parse_threads_per_block
from .dtypes import DType, resolve_dtype, supported_dtype_names
from .errors import ArgumentShapeError, KernelDefinitionError, ShapeExpressionError
from .expressions import Expr, NameInfo, Size, parse_expression

__all__ = [
    "In",
    "InMut",
    "Out",
    "Scalar",
    "Unused",
    "Tune",
    "TensorParam",
    "ScalarParam",
    "UnusedParam",
    "TuneParam",
    "KernelSpec",
    "build_spec",
]


@dataclasses.dataclass(frozen=True)
class TensorParam:
    name: str
    role: str  # "in", "inmut" or "out"
    dtype: DType
    shape: tuple[Expr | None, ...]  # None: free axis (inputs only)
    init: float | int | bool | None = None
    may_alias: tuple[str, ...] = ()  # InMut: tensor arguments it may share memory with

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
        alias = f", may_alias={self.may_alias!r}" if self.may_alias else ""
        return f"{kind}({self.dtype.name}, {self.shape_text()}{init}{alias})"


@dataclasses.dataclass(frozen=True)
class ScalarParam:
    name: str
    dtype: DType
    role: str = "scalar"
    default: float | int | bool | None = None  # None: the argument is required

    @property
    def has_default(self) -> bool:
        return self.default is not None

    def default_text(self) -> str:
        """The default as the schema and the Python signature spell it."""
        return repr(self.default)

    def describe(self) -> str:
        default = f", default={self.default_text()}" if self.has_default else ""
        return f"Scalar({self.dtype.name}{default})"


@dataclasses.dataclass(frozen=True)
class UnusedParam:
    name: str
    role: str = "unused"

    def describe(self) -> str:
        return "Unused"


@dataclasses.dataclass(frozen=True)
class TuneParam:
    """A compile-time constant with its choices (``Tune(1, 2, 4, 8)``): not an argument
    of the op; each choice is compiled into its own variant of the kernel."""

    name: str
    choices: tuple[int | float | bool, ...]
    role: str = "tune"

    @property
    def kind(self) -> str:
        """``"int"``, ``"float"`` or ``"bool"``."""
        return type(self.choices[0]).__name__

    @property
    def tuned(self) -> bool:
        """Whether there is a choice to make (several choices)."""
        return len(self.choices) > 1

    def describe(self) -> str:
        return f"Tune({', '.join(map(repr, self.choices))})"


Param = "TensorParam | ScalarParam | UnusedParam | TuneParam"


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Everything about a kernel's interface, independent of how it is compiled."""

    name: str
    qualname: str
    module: str
    params: tuple[TensorParam | ScalarParam | UnusedParam | TuneParam, ...]
    n_threads: tuple[Expr, ...]  # X, Y, Z order; 1 to 3 entries
    threads_per_block: tuple[int, ...]  # same length as n_threads; the default (first) candidate
    #: Autotune candidates, ``threads_per_block`` first; empty when the block is fixed.
    candidates: tuple[tuple[int, ...], ...] = ()
    #: Autotune key expressions over the arguments; ``None``: every input size, bucketed.
    autotune_key: tuple[Expr, ...] | None = None

    @property
    def autotuned(self) -> bool:
        """Whether the op picks its launch among several candidates: block shapes (see
        :mod:`pnex_magic.blocks`) and the choices of its ``Tune`` parameters."""
        return len(self.launch_candidates) > 1

    @property
    def block_candidates(self) -> tuple[tuple[int, ...], ...]:
        """Every block shape the op may launch with, the default first."""
        return self.candidates or (self.threads_per_block,)

    @functools.cached_property
    def tune_params(self) -> tuple[TuneParam, ...]:
        return tuple(p for p in self.params if isinstance(p, TuneParam))

    @functools.cached_property
    def tune_variants(self) -> tuple[tuple[int | float | bool, ...], ...]:
        """The compiled variants: one value per ``Tune`` parameter (declaration order),
        every combination of their choices, the first choices first.  ``((),)`` for a
        kernel without ``Tune`` parameters: one variant."""
        return tuple(itertools.product(*(p.choices for p in self.tune_params)))

    def tune_values(self, variant: int) -> dict[str, int | float | bool]:
        """``{Tune parameter: value}`` of a variant."""
        return dict(zip((p.name for p in self.tune_params), self.tune_variants[variant]))

    @functools.cached_property
    def launch_candidates(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """What the autotuner chooses among: (block shape, variant) pairs, every block
        for the first variant first; the first pair is the default."""
        return tuple((block, v) for v in range(len(self.tune_variants)) for block in self.block_candidates)

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
        """The operator's arguments, in declaration order (``Tune`` parameters are not
        arguments)."""
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
                default = f"={p.default_text()}" if p.has_default else ""
                args.append(f"{p.dtype.schema_scalar} {p.name}{default}")
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

    @functools.cached_property
    def mutated(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.role == "inmut")

    @functools.cached_property
    def overlap_checks(self) -> tuple[tuple[str, str], ...]:
        """Pairs (written ``InMut`` argument, other tensor argument) that a call
        must find sharing no memory: every ``InMut`` against every other tensor
        argument, each pair once, except where ``may_alias`` allows it."""
        tensors = [p for p in self.arguments if isinstance(p, TensorParam)]
        pairs = []
        for i, w in enumerate(tensors):
            if w.role != "inmut":
                continue
            for j, o in enumerate(tensors):
                if o is w or (o.role == "inmut" and j < i):
                    continue  # a pair of InMuts is checked once, from the first
                if o.name in w.may_alias or w.name in o.may_alias:
                    continue
                pairs.append((w.name, o.name))
        return tuple(pairs)

    def python_signature(self) -> str:
        args = []
        for p in self.arguments:
            if isinstance(p, ScalarParam):
                default = f" = {p.default_text()}" if p.has_default else ""
                args.append(f"{p.name}: {p.dtype.python_type.__name__}{default}")
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
        if self.candidates or self.autotune_key is not None:
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
    tune: dict[str, Any] | None = None,
) -> KernelSpec:
    """Check ``fn``'s annotations and the launch options (:mod:`pnex_magic.blocks`);
    return its :class:`KernelSpec`.  ``tune`` replaces the choices of ``Tune``
    parameters by name (``%%pnex --tune ITEMS=1,2,4``)."""
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

    params: list[TensorParam | ScalarParam | UnusedParam | TuneParam] = []
    visible: dict[str, NameInfo] = {}
    tune_overrides = dict(tune or {})
    may_alias: dict[str, Any] = {}  # InMut name -> its may_alias option, resolved once all names are known
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
        has_default = parameter.default is not parameter.empty
        if ann is Tune or isinstance(ann, Tune):
            if has_default:
                raise KernelDefinitionError(
                    f"{where} is a Tune parameter with a default value ({parameter.default!r}); its value is chosen "
                    f"among its choices: remove the default (the first choice is the default)"
                )
            choices = tune_overrides.pop(pname) if pname in tune_overrides else getattr(ann, "choices", ())
            param = TuneParam(pname, _tune_choices(where, choices))
            params.append(param)
            visible[pname] = NameInfo("scalar", integral=param.kind == "int")
            continue
        if ann is Unused or isinstance(ann, Unused):
            if has_default:
                raise _default_error(where, "an Unused parameter", parameter.default)
            params.append(UnusedParam(pname))
            continue
        if isinstance(ann, type) and issubclass(ann, TensorAnnotation):
            raise KernelDefinitionError(f"{where}: {ann.__name__} needs a dtype and a shape, e.g. {ann.__name__}('f32', (None,))")
        if isinstance(ann, TensorAnnotation):
            if has_default:
                what = "an Out tensor (the op creates it)" if ann.role == "out" else f"an {type(ann).__name__} tensor"
                raise _default_error(where, what, parameter.default)
            dtype = _dtype(where, ann.dtype)
            shape = _shape(where, ann, visible)
            init = getattr(ann, "init", None)
            if init is not None and (isinstance(init, bool) or not isinstance(init, (int, float))):
                if not (dtype.name == "bool" and isinstance(init, bool)):
                    raise KernelDefinitionError(f"{where}: init must be a number, got {init!r}")
            if init is not None:
                _check_value(where, "init", init, dtype, "tensor")
            params.append(TensorParam(pname, ann.role, dtype, shape, init))
            if isinstance(ann, InMut) and ann.may_alias is not False:
                may_alias[pname] = ann.may_alias
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
        default = _scalar_default(where, parameter.default, dtype) if has_default else None
        params.append(ScalarParam(pname, dtype, default=default))
        visible[pname] = NameInfo("scalar", integral=not dtype.is_floating_point and dtype.name != "bool")

    for pname in annotations:
        if pname not in sig.parameters:
            raise KernelDefinitionError(f"kernel {kernel!r}: annotation for {pname!r}, which is not a parameter")
    for pname in tune_overrides:
        found = next((p for p in params if p.name == pname), None)
        kind = "" if found is None else found.describe().split("(")[0]
        what = "not a parameter" if found is None else f"{'an' if kind[:1] in 'AEIOU' else 'a'} {kind} parameter"
        tunes = ", ".join(p.name for p in params if isinstance(p, TuneParam)) or "none"
        raise KernelDefinitionError(
            f"kernel {kernel!r}: choices are given for {pname!r}, which is {what}, not a Tune parameter "
            f"(the kernel's Tune parameters: {tunes})"
        )
    params = _resolve_may_alias(kernel, params, may_alias)
    tuned = {p.name for p in params if isinstance(p, TuneParam) and p.tuned}
    for p in params:
        if isinstance(p, TensorParam):
            for axis, expr in enumerate(p.shape):
                _refuse_tuned(kernel, tuned, expr, f"parameter {p.name!r}'s shape (axis {axis})")

    nt = parse_n_threads(kernel, n_threads)
    candidates = parse_threads_per_block(kernel, threads_per_block, len(nt))
    thread_exprs = tuple(
        parse_expression(e, visible, where=f"kernel {kernel!r}, n_threads[{i}]") for i, e in enumerate(nt)
    )
    arguments = {p.name: visible[p.name] for p in params if p.role in ("in", "inmut", "scalar", "tune")}
    tune_params = [p for p in params if isinstance(p, TuneParam)]
    variants = 1
    for p in tune_params:
        variants *= len(p.choices)
    key = parse_autotune_key(kernel, autotune_key, arguments, autotuned=len(candidates) * variants > 1)
    for i, expr in enumerate(key or ()):
        _refuse_tuned(kernel, tuned, expr, f"autotune_key[{i}]")
    _check_tuned_n_threads(kernel, tune_params, thread_exprs, visible)
    if not any(p.role in ("out", "inmut") for p in params):
        raise KernelDefinitionError(
            f"kernel {kernel!r} has no Out and no InMut parameter, so it can have no effect: a kernel returns "
            f"nothing and cannot write its In tensors. Declare the tensor it writes as Out(dtype, shape) (created "
            f"and returned by the op) or InMut(dtype, shape) (an argument it updates in place)"
        )
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


def _tune_choices(where: str, choices: Any) -> tuple[int | float | bool, ...]:
    """A ``Tune`` parameter's choices, checked: one or more ints, floats or bools, all of
    one kind, no repeats."""
    if isinstance(choices, (int, float, bool)):
        choices = (choices,)
    if not isinstance(choices, (tuple, list)) or not choices:
        raise KernelDefinitionError(
            f"{where}: Tune() needs at least one choice, e.g. Tune(1, 2, 4, 8); got {choices!r}"
        )
    kinds = {type(c) for c in choices}
    if not kinds <= {int, float, bool} or len(kinds) != 1:
        bad = next((c for c in choices if type(c) not in (int, float, bool)), None)
        detail = f"{bad!r} is a {type(bad).__name__}" if bad is not None else (
            f"it mixes {', '.join(sorted(k.__name__ for k in kinds))}")
        raise KernelDefinitionError(
            f"{where}: Tune choices must be ints, floats or bools, all of one kind; {detail} (choices {choices!r})"
        )
    if len(set(choices)) != len(choices):
        raise KernelDefinitionError(f"{where}: Tune choices repeat a value: {choices!r}")
    return tuple(choices)


def _refuse_tuned(kernel: str, tuned: set[str], expr: Expr | None, what: str) -> None:
    """A shape or autotune-key expression may not depend on a ``Tune`` parameter with
    several choices: the tuner compares candidates on the same shapes and keys."""
    if expr is None:
        return
    for name in sorted(expr.names() & tuned):
        raise KernelDefinitionError(
            f"kernel {kernel!r}: {what} uses the Tune parameter {name!r}, which has several choices; shapes and "
            f"the autotune key cannot depend on a tuned value (the tuner compares candidates on the same shapes). "
            f"Use {name!r} in n_threads, or give it one choice"
        )


# Tensor sizes a tuned n_threads is checked with at definition time: a choice that makes
# it zero or negative (or divides by zero) for every call is a mistake in the choices.
_PROBE_SIZE = 1 << 20


def _check_tuned_n_threads(kernel: str, tune_params: list[TuneParam], exprs: tuple[Expr, ...],
                           visible: dict[str, NameInfo]) -> None:
    names = {p.name for p in tune_params}
    scalars = {n for n, info in visible.items() if info.kind == "scalar" and n not in names}
    for axis, expr in enumerate(exprs):
        used = expr.names()
        if not used & names or used & scalars:
            continue  # no Tune parameter in it, or scalar arguments whose values are unknown here
        for values in itertools.product(*(p.choices for p in tune_params)):
            env: dict[str, Any] = dict(zip((p.name for p in tune_params), values))
            for n in used - names:
                env[n] = _ProbeTensor(visible[n].ndim)
            try:
                count = expr.evaluate(env)
            except (ZeroDivisionError, ArgumentShapeError):
                count = None
            if count is None or count <= 0:
                setting = ", ".join(f"{p.name}={v!r}" for p, v in zip(tune_params, values) if p.name in used)
                result = "divides by zero" if count is None else f"gives {count}"
                raise KernelDefinitionError(
                    f"kernel {kernel!r}: with the Tune choice {setting}, n_threads[{axis}] = {expr} {result} for "
                    f"tensors of {_PROBE_SIZE:,} elements per axis; every choice must launch threads. Remove that "
                    f"choice"
                )


class _ProbeTensor:
    """Stands in for a tensor argument when a tuned ``n_threads`` is checked."""

    def __init__(self, ndim: int):
        self.shape = (_PROBE_SIZE,) * max(ndim, 1)

    def size(self, axis: int) -> int:
        return self.shape[axis]

    def numel(self) -> int:
        return _PROBE_SIZE ** len(self.shape)

    def dim(self) -> int:
        return len(self.shape)


def _check_value(where: str, label: str, value: float | int | bool, dtype: DType, owner: str) -> None:
    """``value`` (an ``init`` or a default) must be storable in ``dtype``, the dtype of ``owner``."""
    import math

    import torch

    integral = not dtype.is_floating_point and dtype.name != "bool"
    if integral and isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise KernelDefinitionError(f"{where}: {label}={value!r} is not an integer, but the {owner}'s dtype is {dtype.name}")
    if integral and not torch.iinfo(dtype.torch).min <= value <= torch.iinfo(dtype.torch).max:
        raise KernelDefinitionError(f"{where}: {label}={value!r} does not fit in the {owner}'s dtype, {dtype.name}")
    try:
        torch.full((), value, dtype=dtype.torch)
    except (RuntimeError, OverflowError):
        raise KernelDefinitionError(f"{where}: {label}={value!r} does not fit in the {owner}'s dtype, {dtype.name}") from None


def _default_error(where: str, what: str, default: Any) -> KernelDefinitionError:
    return KernelDefinitionError(
        f"{where} has a default value ({default!r}), but only scalar parameters can have defaults, and this is "
        f"{what}. Remove the default; to give a scalar a default, put the scalar after the tensor parameters"
    )


def _scalar_default(where: str, default: Any, dtype: DType) -> float | int | bool:
    """A scalar parameter's default, checked and converted to the parameter's Python type."""
    import math

    kind = dtype.schema_scalar
    expected = {"bool": "a bool", "int": "an int", "float": "an int or a float"}[kind]
    ok = isinstance(default, bool) if kind == "bool" else (
        isinstance(default, int if kind == "int" else (int, float)) and not isinstance(default, bool)
    )
    if not ok:
        raise KernelDefinitionError(
            f"{where}: the default {default!r} is not {expected} (the parameter is {dtype.name}); "
            f"defaults must be plain Python values of the parameter's type"
        )
    if kind == "float":
        default = float(default)
        if not math.isfinite(default):
            raise KernelDefinitionError(
                f"{where}: the default {default!r} is not finite; an op schema can only hold finite defaults"
            )
    _check_value(where, "default", default, dtype, "parameter")
    return default


def _resolve_may_alias(
    kernel: str, params: list[TensorParam | ScalarParam | UnusedParam], options: dict[str, Any]
) -> list[TensorParam | ScalarParam | UnusedParam]:
    """Turn each ``InMut``'s ``may_alias`` option into the tuple of tensor arguments it names."""
    resolved = []
    inputs = [p.name for p in params if isinstance(p, TensorParam) and p.is_input]
    for p in params:
        option = options.get(p.name, False)
        if option is False:
            resolved.append(p)
            continue
        where = f"kernel {kernel!r}, parameter {p.name!r}"
        others = [n for n in inputs if n != p.name]
        if option is True:
            names = tuple(others)
        else:
            names = (option,) if isinstance(option, str) else as_tuple(option)
            if names is None or not all(isinstance(n, str) for n in names):
                raise KernelDefinitionError(
                    f"{where}: may_alias must be True, False, a parameter name or a tuple of names, got {option!r}"
                )
            for n in names:
                if n not in others:
                    raise KernelDefinitionError(
                        f"{where}: may_alias names {n!r}, which is not another In or InMut parameter "
                        f"(those are: {', '.join(others) or 'none'})"
                    )
        resolved.append(dataclasses.replace(p, may_alias=tuple(names)))
    return resolved


def _dtype(where: str, spelling: Any) -> DType:
    dtype = resolve_dtype(spelling)
    if dtype is None:
        raise KernelDefinitionError(
            f"{where}: unknown dtype {spelling!r}; expected one of {', '.join(supported_dtype_names())} "
            f"(as torch.float32, 'float32', 'f32', numpy dtypes, float, int or bool)"
        )
    return dtype


def _shape(where: str, ann: TensorAnnotation, visible: dict[str, NameInfo]) -> tuple[Expr | None, ...]:
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
