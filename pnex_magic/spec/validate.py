"""The checks :func:`~pnex_magic.spec.build_spec` makes of what cannot be parsed alone:
``Tune`` choices, values that must fit a dtype (an ``init``, a scalar's default),
``may_alias`` names, and expressions that a tuned value may not enter.

Each raises :class:`~pnex_magic.errors.KernelDefinitionError` naming the kernel and
the parameter (``where``), what was expected and how to fix it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..blocks import as_tuple
from ..conditions import Requirement, parse_requirements, parse_tune_rules
from ..dtypes import DType
from ..errors import ArgumentShapeError, KernelDefinitionError, ShapeExpressionError
from ..expressions import Expr, NameInfo, parse_expression
from ..hardware import MAX_SHARED_PER_BLOCK
from .records import ScalarParam, TensorParam, TuneParam, UnusedParam

__all__ = ["argument_rules", "tune_choices", "refuse_tuned", "check_tuned_n_threads", "check_value", "default_error",
           "scalar_default", "resolve_may_alias", "check_record", "shared_bytes_expression"]


def tune_choices(where: str, choices: Any) -> tuple[int | float | bool, ...]:
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


def refuse_tuned(kernel: str, tuned: set[str], expr: Expr | None, what: str) -> None:
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


def check_tuned_n_threads(kernel: str, tune_params: list[TuneParam], exprs: tuple[Expr, ...],
                           visible: dict[str, NameInfo], combinations: Sequence[tuple]) -> None:
    """Refuse a Tune choice for which ``n_threads`` launches no thread (``combinations``: the
    combinations of choices kept, :func:`pnex_magic.conditions.kept_combinations`)."""
    names = {p.name for p in tune_params}
    scalars = {n for n, info in visible.items() if info.kind == "scalar" and n not in names}
    for axis, expr in enumerate(exprs):
        used = expr.names()
        if not used & names or used & scalars:
            continue  # no Tune parameter in it, or scalar arguments whose values are unknown here
        for values in combinations:
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


def check_value(where: str, label: str, value: float | int | bool, dtype: DType, owner: str) -> None:
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


def default_error(where: str, what: str, default: Any) -> KernelDefinitionError:
    return KernelDefinitionError(
        f"{where} has a default value ({default!r}), but only scalar parameters can have defaults, and this is "
        f"{what}. Remove the default; to give a scalar a default, put the scalar after the tensor parameters"
    )


def scalar_default(where: str, default: Any, dtype: DType) -> float | int | bool:
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
    check_value(where, "default", default, dtype, "parameter")
    return default


def resolve_may_alias(
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


def check_record(where: str, dtype: DType, role: str) -> None:
    """A record dtype (``"xoroshiro128p"``) is for tensors the caller passes (``In``,
    ``InMut``): the op cannot make one (``Out``), and a scalar cannot be one."""
    if not dtype.is_record:
        return
    if role in ("in", "inmut"):
        return
    what = "an Out tensor (the op would have to create the states)" if role == "out" else "a scalar"
    raise KernelDefinitionError(
        f"{where}: {dtype.name} states cannot be {what}; declare them InMut({dtype.name!r}, (None,)) and pass "
        f"pnex.xoroshiro128p_states(n, seed, device) (a (n, 2) uint64 tensor: the states Numba's "
        f"create_xoroshiro128p_states makes)"
    )


def shared_bytes_expression(kernel: str, value: Any, tune_params: list[TuneParam],
                            visible: dict[str, NameInfo], combinations: Sequence[tuple]) -> Expr:
    """The ``shared_bytes`` option (bytes of dynamic shared memory per block), checked:
    an int, or an expression over ``Tune`` parameters and integer constants (the
    language of ``n_threads``) that gives, for every ``Tune`` variant (``combinations``:
    those :func:`pnex_magic.conditions.kept_combinations` keeps), an int from 0 to
    the most any GPU allows a block (:data:`~pnex_magic.hardware.MAX_SHARED_PER_BLOCK`).
    It may not name a tensor or a scalar argument: each variant launches with one
    number of bytes, whatever the call's sizes."""
    where = f"kernel {kernel!r}, shared_bytes"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise KernelDefinitionError(
            f"{where}: expected an int (bytes of dynamic shared memory per block) or an expression over Tune "
            f"parameters such as 'STAGES * 64 * 1024', got {value!r}"
        )
    try:
        expr = parse_expression(value, visible, where=where)
    except ShapeExpressionError as exc:
        raise KernelDefinitionError(str(exc)) from None
    tunes = {p.name for p in tune_params}
    for name in sorted(expr.names() - tunes):
        kind = "a tensor" if visible[name].kind == "tensor" else "a scalar argument"
        raise KernelDefinitionError(
            f"{where} = {value!r} names {name!r}, {kind}; shared_bytes may use only Tune parameters "
            f"({', '.join(sorted(tunes)) or 'the kernel has none'}) and integer constants: each Tune variant "
            f"launches with one number of bytes, whatever the call's sizes. Size the shared memory for the "
            f"largest tile the kernel uses"
        )
    for values in combinations:
        env = dict(zip((p.name for p in tune_params), values))
        setting = ", ".join(f"{n}={env[n]!r}" for n in sorted(expr.names()))
        at = f"{where} = {value!r}" + (f" with the Tune choice {setting}" if setting else "")
        try:
            count = expr.evaluate(env)
        except ArgumentShapeError as exc:
            raise KernelDefinitionError(f"{at}: {exc}") from None
        if type(count) is not int:
            raise KernelDefinitionError(f"{at} gives {count!r}, not an int")
        if count < 0:
            raise KernelDefinitionError(f"{at} gives {count:,} bytes; it cannot be negative")
        if count > MAX_SHARED_PER_BLOCK:
            raise KernelDefinitionError(
                f"{at} gives {count:,} bytes of dynamic shared memory per block, more than any GPU allows a block "
                f"({MAX_SHARED_PER_BLOCK:,} B on sm_90); use fewer pipeline stages or smaller tiles"
                + (", or remove that choice (tune_requires= removes a combination of choices)" if setting else "")
            )
    return expr


def argument_rules(kernel: str, requires: Any, params: Sequence[Any],
                   visible: Mapping[str, NameInfo]) -> tuple[Requirement, ...]:
    """The kernel's ``requires`` rules (:func:`pnex_magic.conditions.parse_requirements`),
    over its arguments (``In``, ``InMut``, scalars); its ``Tune`` parameters and outputs are
    refused, each with the reason.  ``jit()`` and a saved artifact read them alike."""
    return parse_requirements(
        kernel, requires, {p.name: visible[p.name] for p in params if p.role in ("in", "inmut", "scalar")},
        tune=[p.name for p in params if isinstance(p, TuneParam)], outputs=[p.name for p in params if p.role == "out"],
    )


def tune_rules(kernel: str, tune_requires: Any, params: Sequence[Any],
               visible: Mapping[str, NameInfo]) -> tuple[Requirement, ...]:
    """The kernel's ``tune_requires`` rules (:func:`pnex_magic.conditions.parse_tune_rules`),
    over its ``Tune`` parameters and its arguments (``In``, ``InMut``, scalars: a rule per
    call); outputs are refused with the reason.  ``jit()`` and a saved artifact read them
    alike."""
    tune_params = [p for p in params if isinstance(p, TuneParam)]
    if tune_requires is not None and not tune_params:
        raise ShapeExpressionError(f"kernel {kernel!r}: tune_requires= needs Tune parameters; the kernel has none")
    return parse_tune_rules(
        kernel, tune_requires, {p.name: NameInfo("scalar", integral=p.kind != "float") for p in tune_params},
        others=[p.name for p in params if not isinstance(p, TuneParam)],
        arguments={p.name: visible[p.name] for p in params if p.role in ("in", "inmut", "scalar")},
        outputs=[p.name for p in params if p.role == "out"],
    )
