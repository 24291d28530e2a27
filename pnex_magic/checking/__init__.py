"""Checked launches: a kernel's variant that tests every array access on the GPU and
records the first one out of bounds instead of making it.

``checked_kernel(fn, spec)`` builds the variant from the kernel's Python source; a
launcher runs it with one more argument, the error record, and raises what the record
holds as :class:`~pnex_magic.errors.KernelIndexError`.  One room per concern:

==========================  ===========================================================
module                      what it holds
==========================  ===========================================================
:mod:`..kernelsource`        (below this package, shared with the simulator's typed
                            rewrite and the derived backward) the AST utilities every
                            source transformation uses: a kernel's ``def`` with its
                            file's line numbers, its namespace, a function rebuilt from
                            a rewritten ``def``, bound names, more trailing parameters
:mod:`.bindings`            what each name of a kernel is bound to
:mod:`.sizes`               which expressions are a tensor's size, which sizes are equal
:mod:`.intervals`           interval proofs: the values integer expressions can take
:mod:`.guards`              guard facts: what ``if i < a.shape[0]`` and the like establish
:mod:`.index_ranges`        :class:`IndexRanges`, the accesses the source proves in bounds
:mod:`.rewrite`             the AST rewrite: each other access becomes a helper call
:mod:`.helpers`             the helpers in Python: what the CUDA simulator runs
:mod:`.lowering`            how a checked access is typed and emitted (LLVM IR)
:mod:`.overloads`           the helpers' CUDA implementations, registered with Numba
:mod:`.tc_helpers`          the tensor-core primitives' checked forms, in Python
:mod:`.tc_overloads`        their CUDA implementations (the rules of
                            :mod:`pnex_magic.tc.rules`)
:mod:`.record`              the error record's layout and the error it becomes
:mod:`.variant`             :func:`checked_kernel`: all of the above, for one kernel
==========================  ===========================================================

Subscripts inside ``@cuda.jit(device=True)`` functions the kernel calls are not
checked: they have no error record.  Nothing here imports Numba until a checked
kernel is built (:func:`pnex_magic.checking.overloads.register`).
"""

from __future__ import annotations

from .index_ranges import Fact, IndexRanges, Interval
from .record import (
    ERR_PARAM,
    FLAG,
    RECORD_SIZE,
    SITE_SLOT,
    Site,
    Violation,
    checked_spec,
    decode_record,
    describe_violation,
    error_buffer,
    violation_error,
)
from ..kernelsource import (
    KernelSource,
    bound_names,
    kernel_source,
    namespace_of,
    plain_signature,
    range_call,
    rebuild,
    with_parameters,
)
from .variant import CheckedKernel, checked_kernel

__all__ = [
    "RECORD_SIZE",
    "ERR_PARAM",
    "FLAG",
    "SITE_SLOT",
    "Site",
    "Violation",
    "CheckedKernel",
    "checked_kernel",
    "checked_spec",
    "error_buffer",
    "decode_record",
    "describe_violation",
    "violation_error",
    "IndexRanges",
    "Interval",
    "Fact",
    "KernelSource",
    "kernel_source",
    "namespace_of",
    "plain_signature",
    "rebuild",
    "with_parameters",
    "bound_names",
    "range_call",
]
