"""The parameter annotations a user writes: ``In``, ``InMut``, ``Out``, ``Scalar``,
``Unused``, ``Tune`` and ``Seed``.  They only record what was written; :func:`pnex_magic.spec.build_spec`
checks them into a :class:`~pnex_magic.spec.KernelSpec`."""

from __future__ import annotations

from typing import Any

__all__ = ["In", "InMut", "Out", "Scalar", "Unused", "Tune", "Seed", "TensorAnnotation"]

ShapeSpec = "tuple[int | str | None, ...] | str"


class TensorAnnotation:
    role = ""

    def __init__(self, dtype: Any, shape: Any):
        self.dtype = dtype
        self.shape = shape

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dtype!r}, {self.shape!r})"

    def __class_getitem__(cls, item):
        return cls(*item) if isinstance(item, tuple) else cls(item)


class In(TensorAnnotation):
    """An input tensor the kernel only reads: ``param: In(dtype, shape)``.

    ``shape`` is the name of another input tensor parameter (same shape as that
    one; declared before or after) or a tuple with one entry per axis: an ``int``
    (fixed size), ``None`` (any size) or an expression string such as
    ``"a.size(0)"``, ``"n * 2"`` or a bare tensor name (that tensor's size on the
    same axis).  An ``Out``'s shape may also name the outputs declared before it.
    """

    role = "in"


class InMut(TensorAnnotation):
    """An input tensor the kernel may write: ``param: InMut(dtype, shape, may_alias=False)``.

    Declared as mutated in the operator's schema, so ``torch.compile`` and
    autograd know about the write.  See :class:`In` for ``shape``.

    Like torch's in-place operators, a call refuses an ``InMut`` tensor in which
    several elements share one memory location (an ``expand()``-ed view), and one
    that shares memory with another tensor argument (the same tensor passed twice,
    or overlapping views of one), since the kernel's threads would race.  A kernel
    written to be safe under such aliasing (each thread reads then writes only its
    own elements, say) declares it: ``may_alias="a"`` (or a tuple of names) allows
    overlap with those tensor arguments, ``may_alias=True`` with any of them.
    """

    role = "inmut"

    def __init__(self, dtype: Any, shape: Any, may_alias: bool | str | tuple[str, ...] = False):
        super().__init__(dtype, shape)
        self.may_alias = may_alias

    def __repr__(self) -> str:
        alias = "" if self.may_alias is False else f", may_alias={self.may_alias!r}"
        return f"InMut({self.dtype!r}, {self.shape!r}{alias})"


class Out(TensorAnnotation):
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
    (float32), ``param: int`` (int64) or any dtype spelling.  A default value
    (``s: float = 1.0``) makes the argument optional; it is part of the op's schema
    (``float s=1.0``).  Only scalars can have defaults."""

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


class Tune:
    """A compile-time constant the autotuner chooses: ``ITEMS: Tune(1, 2, 4, 8)``.

    The parameter is not an argument of the op (callers never pass it): each choice
    is compiled into its own variant of the kernel, where the parameter is a constant
    (``for k in range(ITEMS)`` is unrolled).  On the first GPU call of each autotune
    key the op times every block candidate with every choice (the product, when
    there are several ``Tune`` parameters) and keeps the fastest, as for the block
    alone; the choice is stored on disk.  The first choice is the default: what the
    CUDA simulator and calls that may not benchmark use.  ``Tune(4)``, one choice, is a
    plain constant.

    Choices are ints, floats or bools (all of one kind).  An int ``Tune`` parameter may
    appear in ``n_threads`` like a scalar argument; one with a single choice may appear
    in shape expressions and ``autotune_key`` too (a tuned one may not: the tuner
    compares candidates on the same shapes and keys).
    """

    def __init__(self, *choices: int | float | bool):
        self.choices = choices

    def __repr__(self) -> str:
        return f"Tune({', '.join(map(repr, self.choices))})"


class Seed:
    """A fresh random seed for :mod:`pnex_magic.random` on every call: ``seed: Seed``
    (or ``Seed()``).

    The parameter is not an argument of the op: each call draws a 64-bit seed from
    PyTorch's default generator of the op's device (one ``random_()`` of a one-element
    tensor), so ``torch.manual_seed`` makes runs reproducible, and a CUDA graph that
    captured the call draws a new seed on every replay, as torch's own random ops do.
    In the kernel it is a one-element ``uint64`` array that ``pnex.random``'s
    functions take as their seed: ``pnex.random.uniform(seed, i)``.
    """

    def __repr__(self) -> str:
        return "Seed"
