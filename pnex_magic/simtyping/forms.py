"""A definition's kernel as the CUDA simulator runs it: the typed rewrite
(:func:`.kernel.typed_kernel`) made simulable, from the disk cache where an earlier
process stored it (no Numba typing then), else typed now and stored.

This is the simulator's stage, not the definition's: a kernel that only ever runs on
a GPU never imports the rewrite (its eleven modules: 9 to 18 ms of a
first kernel on a loaded 2-core machine, issue 37).  The definition
(:class:`pnex_magic.definition.KernelDefinition`) memoises the forms; it is handed
:func:`simulated_function` by :func:`pnex_magic.define.definition`, which builds every
definition, and calls it on a CPU launch's first need.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import sys
import types
from typing import TYPE_CHECKING

from .. import cache
from .._version import installed_versions
from ..compiler import numba_signature
from ..definition import toolchain_versions
from ..snapshot import simulable
from . import stored
from .kernel import typed_kernel

if TYPE_CHECKING:
    from ..definition import KernelDefinition

__all__ = ["simulated_function", "typed_function", "SIMULATION"]

log = logging.getLogger(__name__)

#: The cache's records of kernels' typed simulated forms (:mod:`.stored`).
SIMULATION = "simulated"


def simulated_function(definition: KernelDefinition, checked: bool, variant: int) -> types.FunctionType:
    """The kernel as the CUDA simulator runs it (:func:`pnex_magic.snapshot.simulable`):
    :func:`typed_function`'s, with its ``@cuda.jit(device=True)`` functions simulated.

    Raises
    ------
    KernelLaunchError
        The kernel calls CUDA C++ (``cuda.declare_device``), which runs on a GPU only,
        or does what the simulator cannot compute as Numba-CUDA does.
    KernelTypingError
        Numba cannot type the kernel (the GPU compile fails too).
    """
    snapshot, name = definition.snapshot, definition.spec.name
    if snapshot.foreign:  # says so before typing: CUDA C++ has no Python to type
        simulable(snapshot.function, name, snapshot.foreign)
    return simulable(typed_function(definition, checked, variant), name, snapshot.foreign)


def typed_function(definition: KernelDefinition, checked: bool, variant: int) -> types.FunctionType:
    """The kernel (``checked``: its checked variant; ``variant``: for the values of the
    ``Tune`` parameters) rewritten to compute with Numba's types for the parameter types
    the GPU compile is given (``"A"`` layout: any strides), from the disk cache where an
    earlier process stored it, else typed now (and stored)."""
    argtypes = numba_signature(definition.spec_for(checked), "A", variant, definition.snapshot.hidden)
    fn = definition.kernel_function(checked)
    parts = [definition.source_key, toolchain_versions(use_cache=definition.options.use_cache),
             installed_versions("numpy")["numpy"] or "",
             sys.version.split()[0], f"simtyping={stored.FORMAT}", f"checked={checked}",
             ", ".join(map(str, argtypes))]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    options, name = definition.options, definition.spec.name
    if options.use_cache and not options.force:
        record = cache.load_record(SIMULATION, key)
        if record is not None:
            try:
                return stored.loads(base64.b64decode(record["form"]), fn)
            except (ValueError, KeyError, TypeError) as exc:
                log.info("pnex: kernel %r: the stored simulated form is not usable (%s); typing it again", name, exc)
    made: list[bytes] = []
    typed = typed_kernel(fn, argtypes, name, stored=made)
    if options.use_cache:
        cache.store_record(SIMULATION, key, {"kernel": name, "form": base64.b64encode(made[0]).decode()})
    return typed
