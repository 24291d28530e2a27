"""What a launcher needs of a kernel: the interface both a kernel defined in this
process (:class:`pnex_magic.definition.KernelDefinition`) and a kernel loaded
from a saved artifact provide.

The autotuner (:mod:`pnex_magic.launch.autotune`) also uses two optional members
where a kernel has them: ``cache_key(arch, layout)`` (names the build its stored
choices belong to; else the op's name and interface do) and
``compiled(arch, layout=...)`` (ptxas's resource figures, to skip candidates that
cannot run; else every candidate is tried).  Every launcher reads ``hidden_arrays``
where a kernel has them (:mod:`pnex_magic.launch.hidden`: device arrays the kernel
reads as globals, passed after its parameters; a saved kernel has none)."""

from __future__ import annotations

import types
from typing import Any, Protocol

from ..spec import KernelSpec

__all__ = ["Kernel"]


class Kernel(Protocol):
    spec: KernelSpec
    options: Any  # verbose, to_extension, ...

    @property
    def op_name(self) -> str:
        """The op's name in the ``pnex`` namespace."""

    @property
    def compiles(self) -> bool:
        """Whether GPU code exists (or can be made) for this kernel."""

    def kernel_image(self, arch: str, layout: str = "C", variant: int = 0, checked: bool = False) -> tuple[bytes, str]:
        """The code for ``arch`` and the entry name; ``layout`` "C" is the variant for
        C-contiguous inputs, "A" for any strides; ``variant`` the values of the ``Tune``
        parameters (``spec.tune_variants[variant]``); ``checked`` the checked variant
        (:mod:`pnex_magic.checking`; a kernel without one raises a clear error).  The C++ launcher also loads
        NUL-terminated PTX, but pnex's own definitions hand cubins only."""

    @property
    def cooperative(self) -> bool:
        """Whether the kernel synchronises its whole grid (``cuda.cg.this_grid().sync()``):
        GPU launchers then launch it cooperatively and refuse a grid whose blocks cannot
        all be resident at once (:mod:`pnex_magic.launch.cooperative`)."""

    def simulated_function(self, checked: bool = False, variant: int = 0) -> types.FunctionType | None:
        """The Python function the CUDA simulator runs (``None`` without source):
        ``checked``, the checked variant; ``variant``, for the ``Tune`` values
        ``spec.tune_variants[variant]``."""
