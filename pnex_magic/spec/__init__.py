"""The spec stage: a kernel's interface, checked, as an immutable record.

* :mod:`.records`: :class:`KernelSpec` and its parameters (:class:`TensorParam`,
  :class:`ScalarParam`, :class:`UnusedParam`, :class:`TuneParam`, :class:`SeedParam`);
* :mod:`.build`: :func:`build_spec`, from an annotated function and the launch
  options, reading the parameters and their shapes in order;
* :mod:`.validate`: the checks of ``Tune`` choices, defaults, ``init`` values and
  ``may_alias`` that :func:`build_spec` makes.

The annotations a user writes (``In``, ``InMut``, ``Out``, ``Scalar``, ``Unused``,
``Tune``) live in :mod:`pnex_magic.annotations` and are re-exported here.
"""

from __future__ import annotations

from ..annotations import In, InMut, Out, Scalar, Seed, Tune, Unused
from .build import build_spec
from .records import KernelSpec, ScalarParam, SeedParam, TensorParam, TuneParam, UnusedParam

__all__ = [
    "In",
    "InMut",
    "Out",
    "Scalar",
    "Unused",
    "Tune",
    "Seed",
    "TensorParam",
    "ScalarParam",
    "UnusedParam",
    "TuneParam",
    "SeedParam",
    "KernelSpec",
    "build_spec",
]
