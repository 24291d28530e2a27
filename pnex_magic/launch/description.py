"""The description of a kernel that pnex's generic launchers run: plain data.

The C++ launcher (PyTorch's dispatcher), the XLA FFI handler (JAX) and a saved
artifact all start from this dictionary: per parameter its kind, dtype, rank and
shape checks, the op's arguments and outputs, the ``n_threads`` expressions, the
block shape and, for an autotuned op, its block candidates and key, the bytes of
dynamic shared memory each ``Tune`` variant launches with, the memory checks of
``InMut`` arguments (with their messages) and the kernel's ``requires`` rules.  Expressions are
compiled to postfix programs
(:meth:`pnex_magic.expressions.Expr.to_program`) so that C++ evaluates them
without Python.  Nothing in it is code: it round-trips through JSON.
"""

from __future__ import annotations

from typing import Any

from ..calls import alias_message, internal_overlap_message, record_message
from ..conditions import programs
from ..dtypes import resolve_dtype
from ..spec import KernelSpec, ScalarParam, TensorParam

__all__ = ["KINDS", "describe_launch"]

#: Parameter kinds, as the C++ sources number them.  A ``Tune`` parameter has no
#: argument slot: its value is a constant of the variant launched.  A ``Seed`` is a
#: one-element array the launcher draws per call.
KINDS = {"in": 0, "inmut": 1, "out": 2, "scalar": 3, "unused": 4, "tune": 5, "seed": 6}


def describe_launch(spec: KernelSpec) -> dict[str, Any]:
    """The launch description of ``spec`` (see the module docstring)."""
    index_of = spec.index_of
    params = []
    for p in spec.params:
        entry: dict[str, Any] = {"name": p.name, "kind": KINDS[p.role], "init": None}
        if isinstance(p, TensorParam):
            entry.update(
                dtype=p.dtype.name if not p.dtype.is_record else resolve_dtype(p.dtype.torch).name,  # the tensor's
                itemsize=p.dtype.itemsize,
                ndim=p.ndim,
                describe=p.shape_text(),
                shape=[None if e is None else e.to_program(index_of) for e in p.shape],
                shape_text=["" if e is None else str(e) for e in p.shape],
                init=None if p.init is None else float(p.init),
            )
            if p.dtype.is_record:  # a torch axis of `lanes` words per record (only then: saved files compare)
                entry.update(lanes=p.dtype.lanes, record_message=record_message(spec, p))
        else:
            dtype = p.dtype.name if isinstance(p, ScalarParam) else "int64"
            entry.update(dtype=dtype, itemsize=8, ndim=0, describe=p.describe(), shape=[], shape_text=[])
        params.append(entry)
    tune = [spec.index_of(p.name) for p in spec.tune_params]
    key, key_bucket = spec.tuning_key()
    return {
        "kernel": spec.name,
        "params": params,
        "arguments": [index_of(p.name) for p in spec.arguments],
        "outputs": [index_of(p.name) for p in spec.outputs],
        "n_threads": [e.to_program(index_of) for e in spec.n_threads],
        "n_threads_text": [str(e) for e in spec.n_threads],
        "block": _padded(spec.threads_per_block),
        # Autotuning (one candidate, the block, when nothing is tuned): the key's programs,
        # whether their values are bucketed to powers of two, and the candidates: a block
        # padded to 3 axes and the Tune variant it runs (index into "variants").
        "candidates": [[*_padded(block), variant] for block, variant in spec.launch_candidates],
        # Per Tune variant, the integer value of each Tune parameter (parameter "tune"[i])
        # that n_threads may use (floats and bools: 0; expressions take ints only).
        "tune": tune,
        "variants": [
            [v if isinstance(v, int) and not isinstance(v, bool) else 0 for v in values]
            for values in spec.tune_variants
        ],
        # Per Tune variant, the bytes of dynamic shared memory per block (shared_bytes=;
        # cuLaunchKernel's sharedMemBytes).
        "shared": list(spec.shared_per_variant),
        "key": [e.to_program(index_of) for e in key] if spec.autotuned else [],
        "key_text": [str(e) for e in key] if spec.autotuned else [],
        "key_bucket": key_bucket,
        # Memory checks of InMut arguments, with their messages: [parameter, message] for
        # "no two elements in one location", [written, other, message] for "no shared memory".
        "internal_overlap": [[index_of(n), internal_overlap_message(spec, n)] for n in spec.mutated],
        "overlap": [[index_of(w), index_of(o), alias_message(spec, w, o)] for w, o in spec.overlap_checks],
        # The rules every launcher checks (jit(requires=...), and that some Tune combination
        # keeps tune_requires' rules per call), only where there are any (a saved artifact's
        # description from before them compares equal): text, condition, shown terms.
        **({"requires": programs(spec.checked_requires, index_of)} if spec.checked_requires else {}),
    }


def _padded(block: tuple[int, ...]) -> list[int]:
    return list(block) + [1] * (3 - len(block))
