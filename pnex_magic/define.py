"""The core entry point every front end uses: define a kernel as an op.

:func:`define` runs the pipeline (spec → compile → op) for ``jit()``;
:func:`definition` and :func:`registered` split it for front ends that do more
between the steps (the ``%%pnex`` magic checks example arguments against the
spec before anything is registered, then runs the new op on them and attaches
its backward inside the ``registered`` block).

Defining is transactional.  An op name is deterministic (the kernel's name and
where it was defined), so a re-run cell or a re-defined function replaces its op
in torch's dispatcher.  If anything fails after the replacement, inside
:func:`registered`'s block or while registering, the previous definition of the
name is registered again, with its autograd formula, and every op object of the
name calls it: a failed re-definition leaves things as they were, with no
roll-back code in the front end.

Every op object ever made for a name stays usable, because an old object would
otherwise call into a registration torch has freed:

* a re-definition with the same signature (a re-run cell, a fixed kernel) makes
  every earlier object call the new kernel: a model built before the fix picks
  it up;
* a re-definition with a different signature marks the earlier objects
  superseded: calling one raises :class:`~pnex_magic.errors.KernelDefinitionError`
  saying the op was redefined, where, and that the new object is to be used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from . import numbasetup
from .definition import JitOptions, KernelDefinition
from .launch.kernel import Kernel
from .op import PnexOp, Superseded, make_op
from .spec import build_spec

__all__ = ["definition", "registered"]


def definition(
    fn: Callable,
    *,
    n_threads: Any,
    threads_per_block: Any = None,
    autotune_key: Any = None,
    options: JitOptions | None = None,
    name: str | None = None,
    tune: dict[str, Any] | None = None,
    flops: str | int | None = None,
    shared_bytes: Any = 0,
    cluster_dims: Any = None,
    requires: Any = None,
    tune_requires: Any = None,
) -> KernelDefinition:
    """Check ``fn``'s annotations and the launch options (no compiling yet).  ``tune``
    replaces the choices of ``Tune`` parameters by name; ``flops`` is the FLOP count of
    a call, an expression over the parameters (:func:`pnex_magic.roofline.parse_flops`);
    ``shared_bytes`` is the dynamic shared memory per block (an int, or an expression
    over ``Tune`` parameters); ``cluster_dims`` the blocks per thread-block cluster;
    ``requires`` the rules a call's arguments must keep (:mod:`pnex_magic.conditions`);
    ``tune_requires`` the rules that keep combinations of ``Tune`` choices (for every
    call, or per call where a rule names the call's arguments)."""
    spec = build_spec(
        fn, n_threads=n_threads, threads_per_block=threads_per_block, autotune_key=autotune_key, name=name,
        tune=tune, shared_bytes=shared_bytes, cluster_dims=cluster_dims, requires=requires,
        tune_requires=tune_requires,
    )
    found = KernelDefinition(fn, spec, options or JitOptions(), simulate=_simulated_function)
    if flops is not None:  # lazy: the roofline (and the report's modules it imports) is not a kernel's first need
        from .roofline import parse_flops

        found.flops = parse_flops(spec, flops)
    return found


def _simulated_function(found: KernelDefinition, checked: bool, variant: int) -> types.FunctionType:
    """The kernel as the CUDA simulator runs it: the simulator's stage
    (:func:`pnex_magic.simtyping.forms.simulated_function`), which every definition is
    handed here, where the stages meet, so that the definition stage never imports it."""
    # lazy: the simulator's typed rewrite is a CPU launch's need, not a definition's (issue 37)
    from .simtyping.forms import simulated_function

    return simulated_function(found, checked, variant)


@dataclasses.dataclass
class _Name:
    """What is registered under one op name."""

    current: PnexOp  # the op object made last (torch's OPDEFS keeps it alive anyway)
    objects: weakref.WeakSet  # every op object made for the name


_NAMES: dict[str, _Name] = {}


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    definition: Kernel
    state: dict[str, Any]  # the current op object's attributes (its autograd formula among them)


def _snapshot(op_name: str) -> _Snapshot | None:
    entry = _NAMES.get(op_name)
    if entry is None:
        return None
    return _Snapshot(entry.current._pnex, dict(entry.current.__dict__))


def _where(definition: Kernel) -> str:
    code = getattr(getattr(definition, "fn", None), "__code__", None)
    if code is None:  # a kernel loaded from a saved artifact says which
        return getattr(definition, "origin", None) or definition.spec.module
    return f"{code.co_filename}:{code.co_firstlineno}"


def _adopt(op: PnexOp) -> None:
    """Make ``op`` the current op of its name and point the earlier objects at it."""
    name = op._pnex.op_name
    entry = _NAMES.get(name)
    if entry is None:
        _NAMES[name] = _Name(op, weakref.WeakSet([op]))
        return
    new_spec = op._pnex.spec
    for old in list(entry.objects):
        if old is op or old._superseded is not None:
            continue
        old_spec = old._pnex.spec
        if old_spec.schema != new_spec.schema:
            # Keep the old object's own attributes (its definition, for messages and
            # reports) but make every call raise: its signature no longer exists.
            old._superseded = Superseded(old_spec.python_signature(), new_spec.python_signature(), _where(op._pnex))
            old._fast = None  # every call takes __call__, which raises
            continue
        _point_at(old, op)
    entry.current = op
    entry.objects.add(op)


def _point_at(obj: PnexOp, op: PnexOp) -> None:
    """Make the op object ``obj`` call ``op``'s registration (it takes its attributes)."""
    obj.__dict__.clear()
    obj.__dict__.update(op.__dict__)


def _restore(snapshot: _Snapshot | None, op_name: str, failed: PnexOp | None) -> None:
    """Register ``snapshot``'s definition again after a failed re-definition."""
    if snapshot is None:
        return
    restored = make_op(snapshot.definition)
    backward = snapshot.state.get("_backward_fn")
    if backward is not None:
        restored.register_autograd(backward, setup_context=snapshot.state.get("_setup_context_fn"))
    entry = _NAMES[op_name]
    schema = snapshot.definition.spec.schema
    for obj in [*entry.objects, *([failed] if failed is not None else [])]:
        if obj._superseded is not None and obj._pnex.spec.schema != schema:
            continue  # superseded earlier, by a definition of another signature
        _point_at(obj, restored)
    entry.current = restored
    entry.objects.add(restored)


@contextlib.contextmanager
def registered(definition: Kernel) -> Iterator[PnexOp]:
    """Register ``definition`` as an op and yield the op.  A kernel defined here (a
    :class:`~pnex_magic.definition.KernelDefinition`) is compiled first, so typing and
    compile errors are raised before anything is registered; a kernel loaded from a
    saved artifact (:mod:`pnex_magic.artifact`) comes compiled.  If registering or the
    block fails, the previous op of the same name is registered again."""
    start = time.perf_counter()
    defined_here = isinstance(definition, KernelDefinition)
    # The process's first kernel: its compile, registration and the block's first call
    # (the magic's) with older objects frozen (see pnex_magic.numbasetup.first_compile_frozen).
    with numbasetup.first_compile_frozen() if defined_here else contextlib.nullcontext():
        if defined_here:
            definition.check_compiles()
        name = definition.op_name
        snapshot = _snapshot(name)
        op: PnexOp | None = None
        try:
            op = make_op(definition)
            _adopt(op)
            if defined_here and definition.options.verbose:
                _print_summary(definition, start)
            yield op
        except BaseException:
            _restore(snapshot, name, op)
            raise



def _print_summary(d: KernelDefinition, start: float) -> None:
    spec = d.spec
    compiled = d.compiled_if_available()
    print(f"pnex: {spec.python_signature()}")
    print(f"pnex: schema pnex::{d.op_name}{spec.schema}")
    if compiled is None:
        print(f"pnex: not compiled ({d.toolchain_error}); CPU tensors run in the simulator")
    else:
        how = "cache hit" if compiled.cache_hit else f"compiled in {compiled.compile_seconds:.2f} s"
        print(f"pnex: {compiled.arch}, {how}, key {compiled.key[:16]}")
        if compiled.resources is not None:
            r = compiled.resources
            dynamic = spec.shared_of(0)
            print(
                f"pnex: {r.registers} registers/thread, {r.shared_bytes} B shared"
                + (f" + {dynamic} B dynamic (shared_bytes)" if dynamic else "")
                + f", {r.local_bytes} B local, spills {r.spill_store_bytes}/{r.spill_load_bytes} B"
            )
    print(f"pnex: ready in {time.perf_counter() - start:.2f} s")
