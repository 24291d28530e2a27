"""The error record a checked kernel fills, and the error it becomes.

A checked kernel takes one more, last, parameter, :data:`ERR_PARAM`: a 1-D,
C-contiguous int64 array of :data:`RECORD_SIZE` entries, zeroed before the launch,
that the launcher reads after it.  The first access out of bounds of the launch wins
slot 0 (an atomic compare-and-swap on the GPU, a lock in the simulator) and fills it:

======  ==========================================================
slot    content
======  ==========================================================
0       flag: 1 when a violation was recorded (0: none)
1       site: the index into :attr:`CheckedKernel.sites`
2       axis at fault
3       the index on that axis, as written (before wrap-around)
4       the array's rank
5..8    the array's shape, first four axes (0 beyond the rank)
9..11   ``threadIdx`` x, y, z of the thread
12..14  ``blockIdx`` x, y, z
15      the rule broken: 0 for an index out of bounds; a tensor-core
        primitive's span (:mod:`pnex_magic.tc.rules`: code, numbers)
======  ==========================================================

:func:`violation_error` turns a filled record into :class:`~pnex_magic.errors.KernelIndexError`,
an ``IndexError`` whose message names the array, the index, the axis, the shape, the
thread and block and the line (:func:`describe_violation`); for an operand of a
``pnex.tc`` primitive, the primitive, the operand and the rule it breaks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..dtypes import resolve_dtype
from ..errors import KernelIndexError
from ..spec import KernelSpec, TensorParam
from ..tc import rules

__all__ = [
    "RECORD_SIZE", "ERR_PARAM", "FLAG", "SITE_SLOT", "AXIS", "INDEX", "RANK", "SHAPE", "THREAD", "BLOCK",
    "SHAPE_SLOTS", "RULE", "Site", "Violation", "decode_record", "describe_violation", "violation_error", "error_buffer",
    "checked_spec",
]

#: Entries (int64) of the error record a checked kernel writes.
RECORD_SIZE = 16
#: The name of the checked kernel's trailing parameter, the error record.
ERR_PARAM = "__pnex_err"

#: The record's slots (see the table above).
FLAG, SITE_SLOT, AXIS, INDEX, RANK, SHAPE, THREAD, BLOCK = 0, 1, 2, 3, 4, 5, 9, 12
#: How many axes of the shape the record holds.
SHAPE_SLOTS = 4
#: The rule slot (:mod:`pnex_magic.tc.rules`; 0: an index out of bounds).
RULE = 15


@dataclasses.dataclass(frozen=True)
class Site:
    """One checked access in the kernel's source."""

    index: int  #: the number the record's slot 1 holds
    variable: str  #: what is indexed, as written: ``r``, or ``x[i]`` for ``x[i][j]``
    line: int  #: the line in the kernel's file (a ``%%pnex`` cell's own line numbers)
    source_text: str  #: that line, stripped
    kind: str  #: "load", "store", "update" (``x[i] += v``) or "atomic"
    #: "parameter", "shared array", "local array", "global device array" (a hidden argument,
    #: :mod:`pnex_magic.snapshot`) or "" (anything else)
    role: str = ""
    #: for an operand of a tensor-core primitive, the primitive and the operand
    #: (``"pnex.tc.cp_async source"``); "" for a subscript or an atomic
    operand: str = ""


@dataclasses.dataclass(frozen=True)
class Violation:
    """A decoded error record."""

    site: int
    axis: int
    index: int
    rank: int
    shape: tuple[int, ...]  #: the first four axes (all of them up to rank 4)
    thread: tuple[int, int, int]
    block: tuple[int, int, int]
    rule: int = 0  #: the record's rule slot (:mod:`pnex_magic.tc.rules`): 0 for an index out of bounds


def decode_record(record: Sequence[int]) -> Violation | None:
    """The violation a record holds (``None`` when its flag is 0).  ``record`` is any
    sequence of :data:`RECORD_SIZE` integers: a NumPy array, ``tensor.tolist()``."""
    values = [int(v) for v in (record.tolist() if hasattr(record, "tolist") else record)]
    if len(values) != RECORD_SIZE:
        raise ValueError(f"an error record has {RECORD_SIZE} entries, got {len(values)}")
    if not values[FLAG]:
        return None
    rank = values[RANK]
    return Violation(
        site=values[SITE_SLOT],
        axis=values[AXIS],
        index=values[INDEX],
        rank=rank,
        shape=tuple(values[SHAPE : SHAPE + min(rank, SHAPE_SLOTS)]),
        thread=tuple(values[THREAD : THREAD + 3]),
        block=tuple(values[BLOCK : BLOCK + 3]),
        rule=values[RULE],
    )


def _shape_text(v: Violation) -> str:
    dims = [str(n) for n in v.shape] + (["..."] if v.rank > SHAPE_SLOTS else [])
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def describe_violation(kernel_name: str, record: Sequence[int], sites: Sequence[Site]) -> str:
    """One sentence about the violation ``record`` holds, e.g. ``copy(): index 1024 is
    out of bounds for axis 0 of parameter 'r' (shape (1024,)), at line 6: `r[i + 1] =
    a[i]`, thread (0, 0, 0) of block (4, 0, 0)``.  The line is the kernel's file's (a
    ``%%pnex`` cell's pseudo-file numbers lines from the cell's first)."""
    v = decode_record(record)
    if v is None:
        return f"{kernel_name}(): no access out of bounds"
    site = sites[v.site] if 0 <= v.site < len(sites) else None
    if site is None:
        what, where = "an array", f" (unknown access site {v.site})"
    else:
        what = f"{site.role} '{site.variable}'" if site.role else f"'{site.variable}'"
        where = f", at line {site.line}: `{site.source_text}`"
    thread = ", ".join(map(str, v.thread))
    block = ", ".join(map(str, v.block))
    if v.rule or (site is not None and site.operand):
        code, param, a, b = rules.unpack(v.rule)
        reason = rules.describe(code, param, a, b, v.axis, v.index, v.shape, what)
        operand = f"{site.operand}: " if site is not None and site.operand else ""
        return f"{kernel_name}(): {operand}{reason}{where}, thread ({thread}) of block ({block})"
    return (
        f"{kernel_name}(): index {v.index} is out of bounds for axis {v.axis} of {what} "
        f"(shape {_shape_text(v)}){where}, thread ({thread}) of block ({block})"
    )


def violation_error(kernel_name: str, record: Sequence[int], sites: Sequence[Site]) -> KernelIndexError | None:
    """The exception a launcher raises after a checked launch whose record holds a
    violation (``None`` when it holds none).  It is an ``IndexError``; its
    ``violation`` and ``site`` attributes hold the decoded record and the site."""
    v = decode_record(record)
    if v is None:
        return None
    site = sites[v.site] if 0 <= v.site < len(sites) else None
    return KernelIndexError(describe_violation(kernel_name, record, sites), violation=v, site=site)


def error_buffer(device: Any = "cpu") -> Any:
    """A zeroed error record (a torch int64 tensor of :data:`RECORD_SIZE`) on ``device``."""
    import torch

    return torch.zeros(RECORD_SIZE, dtype=torch.int64, device=device)


def checked_spec(spec: KernelSpec) -> KernelSpec:
    """``spec`` with the error record appended as a trailing ``InMut`` int64 1-D
    parameter named :data:`ERR_PARAM`: what the compile stage
    (:func:`pnex_magic.compiler.compile_kernel`) and the launchers take for the checked
    variant (Numba's ABI: 7 eight-byte slots, meminfo, parent, nitems, itemsize, data,
    shape, stride)."""
    err = TensorParam(name=ERR_PARAM, role="inmut", dtype=resolve_dtype("int64"), shape=(None,))
    return dataclasses.replace(spec, params=(*spec.params, err))
