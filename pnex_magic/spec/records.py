"""The kernel specification: immutable records of a kernel's interface.

:class:`KernelSpec` holds everything about a kernel's interface, independent of how it
is compiled: its parameters (:class:`TensorParam`, :class:`ScalarParam`,
:class:`UnusedParam`, :class:`TuneParam`), ``n_threads``, the block and its autotune
candidates, the autotune key; and what follows from them (the op's schema, its
arguments and outputs, the ``Tune`` variants and launch candidates).
:func:`pnex_magic.spec.build_spec` makes one from an annotated function.
"""

from __future__ import annotations

import dataclasses
import functools

from ..dtypes import DType
from ..conditions import Condition, Requirement, any_variant_rule, kept_combinations, per_call, variant_check
from ..expressions import Const, Expr, Size

__all__ = ["TensorParam", "ScalarParam", "UnusedParam", "TuneParam", "SeedParam", "KernelSpec"]


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
        """Axes as the kernel sees the array (a record dtype's words are not an axis)."""
        return len(self.shape)

    @property
    def storage_ndim(self) -> int:
        """Axes of the torch tensor: :attr:`ndim`, plus the trailing axis of a record
        dtype's words (``"xoroshiro128p"``: a (n, 2) uint64 tensor is a 1-D array)."""
        return self.ndim + (1 if self.dtype.is_record else 0)

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


@dataclasses.dataclass(frozen=True)
class SeedParam:
    """A seed for :mod:`pnex_magic.random`, drawn from PyTorch's generator on every call
    (``seed: Seed``): not an argument of the op; in the kernel a one-element uint64
    array."""

    name: str
    role: str = "seed"

    def describe(self) -> str:
        return "Seed"


Param = "TensorParam | ScalarParam | UnusedParam | TuneParam | SeedParam"


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Everything about a kernel's interface, independent of how it is compiled."""

    name: str
    qualname: str
    module: str
    params: tuple[TensorParam | ScalarParam | UnusedParam | TuneParam | SeedParam, ...]
    n_threads: tuple[Expr, ...]  # X, Y, Z order; 1 to 3 entries
    threads_per_block: tuple[int, ...]  # same length as n_threads; the default (first) candidate
    #: Autotune candidates, ``threads_per_block`` first; empty when the block is fixed.
    candidates: tuple[tuple[int, ...], ...] = ()
    #: Autotune key expressions over the arguments; ``None``: every input size, bucketed.
    autotune_key: tuple[Expr, ...] | None = None
    #: Dynamic shared memory per block, in bytes: an expression over ``Tune`` parameters
    #: and integer constants (``shared_bytes=``), a constant of each variant.
    shared_bytes: Expr = Const(0)
    #: Blocks per thread-block cluster along x, y, z (``cluster_dims=``, sm_90); ``None``: no clusters.
    cluster_dims: tuple[int, int, int] | None = None
    #: Rules the call's arguments must keep (``requires=``, :mod:`pnex_magic.conditions`): every
    #: launcher refuses a call that breaks one.
    requires: tuple[Requirement, ...] = ()
    #: Rules on the ``Tune`` parameters (``tune_requires=``): only the combinations of choices
    #: that keep those over ``Tune`` parameters alone are variants; those that also name the
    #: call's arguments (:attr:`call_tune_rules`) choose among the variants per call.
    tune_rules: tuple[Requirement, ...] = ()

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
        every combination of their choices that keeps :attr:`tune_rules`, the first
        choices first.  ``((),)`` for a kernel without ``Tune`` parameters: one variant."""
        return kept_combinations(self.name, [p.name for p in self.tune_params], [p.choices for p in self.tune_params],
                                 self.tune_rules)

    @functools.cached_property
    def call_tune_rules(self) -> tuple[Requirement, ...]:
        """The ``tune_requires`` rules that name the call's arguments: a call launches only
        the variants that keep them (:attr:`variant_checks`)."""
        return tuple(r for r in self.tune_rules if per_call(r, [p.name for p in self.tune_params]))

    @functools.cached_property
    def variant_checks(self) -> tuple[Condition, ...]:
        """Per variant, the condition its ``Tune`` values put on a call (the rules of
        :attr:`call_tune_rules` with those values in place of the names); ``()`` where
        there are no such rules.  Their values (1 or 0) end the autotune key
        (:meth:`tuning_key`), so calls of one key may launch the same variants."""
        if not self.call_tune_rules:
            return ()
        return tuple(variant_check(self.call_tune_rules, self.tune_values(v)) for v in range(len(self.tune_variants)))

    @functools.cached_property
    def checked_requires(self) -> tuple[Requirement, ...]:
        """The rules every launcher checks on a call: :attr:`requires`, and where
        ``tune_requires`` has rules per call, that some variant keeps them."""
        if not self.variant_checks:
            return self.requires
        names = [p.name for p in self.tune_params]
        combinations = [", ".join(f"{n}={v!r}" for n, v in zip(names, values)) for values in self.tune_variants]
        return (*self.requires, any_variant_rule(self.name, self.call_tune_rules, self.variant_checks, combinations))

    def eligible(self, key: tuple[int, ...]) -> tuple[bool, ...]:
        """Per variant, whether a call of autotune key ``key`` (:meth:`tuning_key`'s values)
        may launch it: every variant where no ``tune_requires`` rule names the call."""
        n = len(self.variant_checks)
        if not n:
            return (True,) * len(self.tune_variants)
        return tuple(bool(v) for v in key[len(key) - n:])

    def first_candidate(self, key: tuple[int, ...]) -> int:
        """The launch candidate a call of autotune key ``key`` runs untuned: the first whose
        variant it may launch (0 where no ``tune_requires`` rule names the call)."""
        eligible = self.eligible(key)
        return next((i for i, (_, v) in enumerate(self.launch_candidates) if eligible[v]), 0)

    def tune_values(self, variant: int) -> dict[str, int | float | bool]:
        """``{Tune parameter: value}`` of a variant."""
        return dict(zip((p.name for p in self.tune_params), self.tune_variants[variant]))

    @functools.cached_property
    def shared_per_variant(self) -> tuple[int, ...]:
        """The bytes of dynamic shared memory each ``Tune`` variant launches with
        (:attr:`shared_bytes` evaluated on its values; checked at definition)."""
        return tuple(int(self.shared_bytes.evaluate(self.tune_values(v))) for v in range(len(self.tune_variants)))

    def shared_of(self, variant: int = 0) -> int:
        """The bytes of dynamic shared memory variant ``variant`` launches with."""
        return self.shared_per_variant[variant]

    @functools.cached_property
    def launch_candidates(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """What the autotuner chooses among: (block shape, variant) pairs, every block
        for the first variant first; the first pair is the default."""
        return tuple((block, v) for v in range(len(self.tune_variants)) for block in self.block_candidates)

    def tuning_key(self) -> tuple[tuple[Expr, ...], bool]:
        """The autotune key's expressions and whether their values are bucketed to powers
        of two (the default key: every input tensor's size on every axis), then
        :attr:`variant_checks`: which variants the call may launch."""
        if self.autotune_key is not None:
            return self.autotune_key + self.variant_checks, False
        sizes = tuple(Size(p.name, axis) for p in self.params if isinstance(p, TensorParam) and p.is_input
                      for axis in range(p.ndim))
        return sizes + self.variant_checks, True  # (a check's 0 or 1 is its own power-of-two bucket)

    @functools.cached_property  # read on every call of the op's Python path
    def arguments(self) -> tuple[TensorParam | ScalarParam, ...]:
        """The operator's arguments, in declaration order (``Tune`` parameters are not
        arguments)."""
        return tuple(p for p in self.params if p.role in ("in", "inmut", "scalar"))

    @functools.cached_property
    def outputs(self) -> tuple[TensorParam, ...]:
        return tuple(p for p in self.params if p.role == "out")

    @functools.cached_property
    def seeds(self) -> tuple[SeedParam, ...]:
        """The ``Seed`` parameters: each call draws one seed for each (read on every call
        of the op's Python path)."""
        return tuple(p for p in self.params if isinstance(p, SeedParam))

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
        if self.shared_bytes != Const(0):
            text += f" shared_bytes={self.shared_bytes}"
        if self.cluster_dims is not None:
            text += f" cluster_dims={self.cluster_dims}"
        if self.requires:
            text += f" requires={[r.text for r in self.requires]}"
        if self.candidates or self.autotune_key is not None:
            key = "default" if self.autotune_key is None else tuple(map(str, self.autotune_key))
            text += f" candidates={self.candidates} autotune_key={key}"
        return text
