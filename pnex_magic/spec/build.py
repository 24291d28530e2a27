"""From an annotated function to its :class:`~pnex_magic.spec.records.KernelSpec`.

``In``, ``InMut``, ``Out``, ``Scalar``, ``Unused`` and ``Tune``
(:mod:`pnex_magic.annotations`) are what a user writes; :func:`build_spec` turns an
annotated function plus the launch options into an immutable spec, checking
everything that can be checked before compiling: annotations, dtypes, scalar
defaults, shape and ``n_threads`` expressions, launch dimensions, and that the kernel
writes something.  The parameters are read in order, then every tensor's shape,
which may name any input tensor or integer scalar, earlier or later in the
signature, and, for an output, the outputs declared before it (:func:`_with_shapes`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from ..annotations import InMut, Scalar, Seed, TensorAnnotation, Tune, Unused
from ..clusters import parse_cluster_dims
from ..conditions import kept_combinations
from ..blocks import as_tuple, parse_autotune_key, parse_n_threads, parse_threads_per_block
from ..dtypes import DType, record_dtype_names, resolve_dtype, supported_dtype_names
from ..errors import KernelDefinitionError, ShapeExpressionError
from ..expressions import Expr, NameInfo, Size, parse_expression
from .records import KernelSpec, ScalarParam, SeedParam, TensorParam, TuneParam, UnusedParam
from .validate import (
    argument_rules,
    check_record,
    check_tuned_n_threads,
    check_value,
    default_error,
    refuse_tuned,
    resolve_may_alias,
    scalar_default,
    shared_bytes_expression,
    tune_choices,
    tune_rules,
)

__all__ = ["build_spec"]


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
    shared_bytes: Any = 0,
    cluster_dims: Any = None,
    requires: Any = None,
    tune_requires: Any = None,
) -> KernelSpec:
    """Check ``fn``'s annotations and the launch options (:mod:`pnex_magic.blocks`);
    return its :class:`KernelSpec`.  ``tune`` replaces the choices of ``Tune``
    parameters by name (``%%pnex --tune ITEMS=1,2,4``); ``shared_bytes`` is the dynamic
    shared memory per block (:func:`~pnex_magic.spec.validate.shared_bytes_expression`);
    ``cluster_dims`` the blocks per thread-block cluster (:mod:`pnex_magic.clusters`);
    ``requires`` the rules on the arguments (:mod:`pnex_magic.conditions`);
    ``tune_requires`` the rules that keep combinations of ``Tune`` choices."""
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

    params: list[TensorParam | ScalarParam | UnusedParam | TuneParam | SeedParam] = []
    visible: dict[str, NameInfo] = {}
    tune_overrides = dict(tune or {})
    may_alias: dict[str, Any] = {}  # InMut name -> its may_alias option, resolved once all names are known
    tensors: dict[str, tuple[str, TensorAnnotation]] = {}  # tensor name -> (where, annotation): shapes come last
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
            param = TuneParam(pname, tune_choices(where, choices))
            params.append(param)
            visible[pname] = NameInfo("scalar", integral=param.kind == "int")
            continue
        if ann is Unused or isinstance(ann, Unused):
            if has_default:
                raise default_error(where, "an Unused parameter", parameter.default)
            params.append(UnusedParam(pname))
            continue
        if ann is Seed or isinstance(ann, Seed):
            if has_default:
                raise default_error(where, "a Seed parameter (each call draws it)", parameter.default)
            params.append(SeedParam(pname))
            continue
        if isinstance(ann, type) and issubclass(ann, TensorAnnotation):
            raise KernelDefinitionError(f"{where}: {ann.__name__} needs a dtype and a shape, e.g. {ann.__name__}('f32', (None,))")
        if isinstance(ann, TensorAnnotation):
            if has_default:
                what = "an Out tensor (the op creates it)" if ann.role == "out" else f"an {type(ann).__name__} tensor"
                raise default_error(where, what, parameter.default)
            dtype = _dtype(where, ann.dtype)
            check_record(where, dtype, ann.role)
            init = getattr(ann, "init", None)
            if init is not None and (isinstance(init, bool) or not isinstance(init, (int, float))):
                if not (dtype.name == "bool" and isinstance(init, bool)):
                    raise KernelDefinitionError(f"{where}: init must be a number, got {init!r}")
            if init is not None:
                check_value(where, "init", init, dtype, "tensor")
            # The shape waits for every parameter: it may name one declared later.
            params.append(TensorParam(pname, ann.role, dtype, (), init))
            tensors[pname] = (where, ann)
            if isinstance(ann, InMut) and ann.may_alias is not False:
                may_alias[pname] = ann.may_alias
            continue
        if isinstance(ann, Scalar):
            dtype = _dtype(where, ann.dtype)
        elif resolve_dtype(ann) is not None:
            dtype = resolve_dtype(ann)
        elif type(ann).__name__ == "CPointer" and type(ann).__module__.startswith("numba"):
            pointee = resolve_dtype(getattr(ann, "dtype", None))
            spelled = f"'{pointee.short}'" if pointee is not None else "dtype"
            raise KernelDefinitionError(
                f"{where}: {ann} is a raw pointer (CPointer), which a PyTorch op cannot take: pnex passes tensors. "
                f"Annotate it InMut({spelled}, (None,)) (or In(...) if the kernel only reads it) and pass the tensor "
                f"itself; the body indexes it the same way (x[i])"
            )
        else:
            raise KernelDefinitionError(
                f"{where}: {ann!r} is not a pnex annotation; expected In(dtype, shape), InMut(dtype, shape), "
                f"Out(dtype, shape[, init]), Scalar(dtype), a dtype such as float or 'f32', or Unused"
            )
        check_record(where, dtype, "scalar")
        default = scalar_default(where, parameter.default, dtype) if has_default else None
        params.append(ScalarParam(pname, dtype, default=default))
        visible[pname] = NameInfo("scalar", integral=not dtype.is_floating_point and dtype.name != "bool")

    for pname in annotations:
        if pname not in sig.parameters:
            raise KernelDefinitionError(f"kernel {kernel!r}: annotation for {pname!r}, which is not a parameter")
    params = _with_shapes(params, tensors, visible)
    for pname in tune_overrides:
        found = next((p for p in params if p.name == pname), None)
        kind = "" if found is None else found.describe().split("(")[0]
        what = "not a parameter" if found is None else f"{'an' if kind[:1] in 'AEIOU' else 'a'} {kind} parameter"
        tunes = ", ".join(p.name for p in params if isinstance(p, TuneParam)) or "none"
        raise KernelDefinitionError(
            f"kernel {kernel!r}: choices are given for {pname!r}, which is {what}, not a Tune parameter "
            f"(the kernel's Tune parameters: {tunes})"
        )
    params = resolve_may_alias(kernel, params, may_alias)
    tuned = {p.name for p in params if isinstance(p, TuneParam) and p.tuned}
    for p in params:
        if isinstance(p, TensorParam):
            for axis, expr in enumerate(p.shape):
                refuse_tuned(kernel, tuned, expr, f"parameter {p.name!r}'s shape (axis {axis})")

    nt = parse_n_threads(kernel, n_threads)
    candidates = parse_threads_per_block(kernel, threads_per_block, len(nt))
    thread_exprs = tuple(
        parse_expression(e, visible, where=f"kernel {kernel!r}, n_threads[{i}]") for i, e in enumerate(nt)
    )
    arguments = {p.name: visible[p.name] for p in params if p.role in ("in", "inmut", "scalar", "tune")}
    tune_params = [p for p in params if isinstance(p, TuneParam)]
    kept_rules = tune_rules(kernel, tune_requires, params, visible)
    combinations = kept_combinations(kernel, [p.name for p in tune_params], [p.choices for p in tune_params],
                                     kept_rules)
    key = parse_autotune_key(kernel, autotune_key, arguments, autotuned=len(candidates) * len(combinations) > 1)
    for i, expr in enumerate(key or ()):
        refuse_tuned(kernel, tuned, expr, f"autotune_key[{i}]")
    check_tuned_n_threads(kernel, tune_params, thread_exprs, visible, combinations)
    shared = shared_bytes_expression(kernel, shared_bytes, tune_params, visible, combinations)
    clusters = parse_cluster_dims(kernel, cluster_dims, len(nt))
    rules = argument_rules(kernel, requires, params, visible)
    if not any(p.role in ("out", "inmut") for p in params):
        raise KernelDefinitionError(
            f"kernel {kernel!r} has no Out and no InMut parameter, so it can have no effect: a kernel returns "
            f"nothing and cannot write its In tensors. Declare the tensor it writes as Out(dtype, shape) (created "
            f"and returned by the op) or InMut(dtype, shape) (an argument it updates in place)"
        )
    spec = KernelSpec(
        name=kernel,
        qualname=getattr(fn, "__qualname__", kernel),
        module=getattr(fn, "__module__", None) or "__main__",
        params=tuple(params),
        n_threads=thread_exprs,
        threads_per_block=candidates[0],
        candidates=candidates if len(candidates) > 1 else (),
        autotune_key=key,
        shared_bytes=shared,
        cluster_dims=clusters,
        requires=rules,
        tune_rules=kept_rules,
    )
    _ = spec.checked_requires  # tune_requires per call: the rule every launcher checks, made (and checked) now
    return spec


def _dtype(where: str, spelling: Any) -> DType:
    dtype = resolve_dtype(spelling)
    if dtype is None:
        raise KernelDefinitionError(
            f"{where}: unknown dtype {spelling!r}; expected one of {', '.join(supported_dtype_names())} "
            f"(as torch.float32, 'float32', 'f32', numpy dtypes, float, int or bool), or the record dtype "
            f"{', '.join(record_dtype_names())} (Numba's generator states)"
        )
    return dtype


def _with_shapes(
    params: list[TensorParam | ScalarParam | UnusedParam | TuneParam],
    tensors: dict[str, tuple[str, TensorAnnotation]],
    visible: dict[str, NameInfo],
) -> list[TensorParam | ScalarParam | UnusedParam | TuneParam]:
    """``params`` with every tensor's shape resolved, over every parameter: a shape may
    name a parameter declared later (``def k(r: Out("f32", "x"), x: In(...))``, as
    ufunc-style kernels put the output first).  Adds the tensors to ``visible``.

    An input's shape names other inputs and integer scalars (the call checks it against
    them); an output's also names the outputs declared before it (the op creates its
    outputs in declaration order).  A tensor shaped like itself, through others or
    directly, has no shape: refused."""
    ndims = _ranks(tensors, visible)
    for name, ndim in ndims.items():
        visible[name] = NameInfo("tensor", ndim=ndim)
    resolved = []
    outputs_before: set[str] = set()
    for p in params:
        if isinstance(p, TensorParam):
            where, ann = tensors[p.name]
            allowed = {n for n, (_, a) in tensors.items() if a.role != "out" and n != p.name}
            allowed |= {n for n, info in visible.items() if info.kind == "scalar"}
            if p.role == "out":
                allowed |= outputs_before
                outputs_before.add(p.name)
            p = dataclasses.replace(p, shape=_shape(where, ann, p.name, ndims[p.name], visible, allowed, tensors))
        resolved.append(p)
    return resolved


def _ranks(tensors: dict[str, tuple[str, TensorAnnotation]], visible: dict[str, NameInfo]) -> dict[str, int]:
    """Each tensor's rank: its shape tuple's length, or the rank of the tensor its shape
    names (followed through names; a cycle is refused)."""
    ndims: dict[str, int] = {}

    def rank(name: str, chain: tuple[str, ...]) -> int:
        if name in ndims:
            return ndims[name]
        where, ann = tensors[name]
        shape = ann.shape
        if isinstance(shape, str):
            if shape not in tensors:
                names = ", ".join(tensors) or "none"
                problem = f"{shape!r} is a scalar" if shape in visible else f"{shape!r} is not a tensor parameter"
                raise ShapeExpressionError(
                    f"{where}: shape {shape!r} means 'same shape as {shape}', but {problem} (tensor parameters: {names})"
                )
            if shape in chain or shape == name:
                loop = chain[chain.index(shape):] if shape in chain else ()
                cycle = " -> ".join((*loop, name, shape))
                raise ShapeExpressionError(
                    f"{where}: shape {shape!r} means 'same shape as {shape}', but the shapes name each other in a "
                    f"cycle ({cycle}), so none has a size; give one of them its sizes, e.g. (None,) for an input"
                )
            ndims[name] = rank(shape, (*chain, name))
            return ndims[name]
        entries = as_tuple(shape)
        if entries is None:
            if not (isinstance(shape, int) and not isinstance(shape, bool)):
                raise ShapeExpressionError(
                    f"{where}: shape must be a tuple of int/str/None or the name of a tensor parameter, got {shape!r}"
                )
            entries = (shape,)
        ndims[name] = len(entries)
        return ndims[name]

    for name in tensors:
        rank(name, ())
    return ndims


def _shape(
    where: str, ann: TensorAnnotation, name: str, ndim: int, visible: dict[str, NameInfo], allowed: set[str],
    tensors: dict[str, tuple[str, TensorAnnotation]],
) -> tuple[Expr | None, ...]:
    shape = ann.shape
    if isinstance(shape, str):
        _refuse_names(where, f"shape {shape!r}", {shape}, ann, name, allowed, tensors)
        return tuple(Size(shape, axis) for axis in range(ndim))
    entries = as_tuple(shape)
    if entries is None:
        entries = (shape,)
    others = {n: info for n, info in visible.items() if n != name}
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
        expr = parse_expression(entry, others, where=at, axis=axis)
        if isinstance(entry, int) and entry < 0:
            raise ShapeExpressionError(f"{at}: a size cannot be negative, got {entry}")
        _refuse_names(at, repr(entry), expr.names(), ann, name, allowed, tensors)
        result.append(expr)
    return tuple(result)


def _refuse_names(
    where: str, what: str, names: set[str], ann: TensorAnnotation, name: str, allowed: set[str],
    tensors: dict[str, tuple[str, TensorAnnotation]],
) -> None:
    """Refuse a shape naming an output it cannot depend on."""
    for other in sorted(names - allowed):
        if ann.role != "out":
            raise ShapeExpressionError(
                f"{where}: {what} names {other!r}, an Out tensor, but an input's sizes are checked against the "
                f"arguments before the op creates its outputs; name the inputs or scalars it depends on instead"
            )
        raise ShapeExpressionError(
            f"{where}: {what} names {other!r}, an Out tensor declared after {name!r}; the op creates its outputs in "
            f"declaration order, so an output's shape may name the inputs, the scalars and the outputs declared "
            f"before it. Name the inputs {other!r} is shaped from, or declare {other!r} first"
        )
