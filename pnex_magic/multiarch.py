"""Compile stage, ahead of time: one kernel's GPU code for several architectures at
once, as a saved artifact ships it (:mod:`pnex_magic.artifact`).

For each input layout ("C": contiguous inputs, "A": any strides), NVVM's PTX is
compiled once, for the oldest architecture asked for
(:meth:`~pnex_magic.definition.KernelDefinition.compiled`, so the disk cache
serves it), and nvJitLink assembles it into a cubin for every architecture.  A
cubin costs about 10 ms that way, where compiling through Numba and NVVM again
costs about 0.1 s per architecture and layout (2 CPU cores); NVVM's PTX for sm_75
to sm_90 differs only in its ``.target`` line, so ptxas sees the same program.
The same PTX is the fallback for GPUs that have no cubin: it loads on any newer
architecture.

PTX that calls external functions (Numba's float16/bfloat16 operators on some
architectures, ``declare_device(..., link=...)``) would not load on its own, so
such a kernel is compiled to LTO-IR and linked with what it calls into one
self-contained PTX first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from .arch import arch_name, parse_arch
from .definition import KernelDefinition
from .errors import KernelCompileError, KernelDefinitionError
from .linking import has_external_calls, link_cubin, link_ptx, ptx_entry

__all__ = ["DEFAULT_ARCHS", "LAYOUTS", "ArchImages", "target_archs", "build_images"]

#: Turing (T4) to Blackwell (B200): every architecture CUDA 13 compiles for up to sm_100.
DEFAULT_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100")

#: The input layouts a GPU launcher picks from: "C" when every input is contiguous, else "A".
LAYOUTS = ("C", "A")


@dataclasses.dataclass(frozen=True)
class ArchImages:
    """A kernel's code for one input layout: a cubin per architecture, and the PTX
    (for ``ptx_arch``, the oldest) they were linked from."""

    layout: str
    ptx_arch: str
    entry: str  # the kernel's entry name, in the PTX and in every cubin
    ptx: str  # self-contained: calls no external function
    cubins: Mapping[str, bytes]


def target_archs(archs: str | Iterable[str]) -> tuple[str, ...]:
    """``archs`` as ``sm_XY`` names, oldest first, without duplicates (one name may
    be given as a plain string)."""
    if isinstance(archs, str):
        archs = (archs,)
    if not isinstance(archs, Iterable):
        raise KernelDefinitionError(f"archs must be architecture names such as ('sm_80', 'sm_90'), got {archs!r}")
    ccs = sorted({parse_arch(a) for a in archs})
    if not ccs:
        raise KernelDefinitionError("archs is empty: name at least one GPU architecture, e.g. ('sm_80', 'sm_90')")
    return tuple(arch_name(cc) for cc in ccs)


def build_images(
    definition: KernelDefinition, archs: str | Iterable[str], layout: str = "C", variant: int = 0
) -> ArchImages:
    """The kernel's PTX for the oldest of ``archs`` and a cubin for each of them, for
    input ``layout`` and ``Tune`` variant ``variant``.  Raises the compile errors of
    :meth:`~pnex_magic.definition.KernelDefinition.compiled` and
    :class:`~pnex_magic.errors.KernelCompileError` where nvJitLink cannot link an
    architecture."""
    archs = target_archs(archs)
    for arch in archs:  # a tensor-core primitive some of them lack: refused by name, before any compile
        definition.target_arch(arch)
    ptx_arch = archs[0]
    compiled = definition.compiled(ptx_arch, layout=layout, variant=variant)
    ptx, entry = compiled.ptx, compiled.entry
    name = definition.spec.name
    max_registers = definition.options.max_registers
    cubins: dict[str, bytes] = {}
    if has_external_calls(ptx):
        from .compiler import ltoir_objects  # building images compiles; loading them does not

        objects = ltoir_objects(
            definition.compile_function(), definition.spec, parse_arch(ptx_arch), layout, variant,
            definition.hidden_arrays, ptx,
        )
        ptx = link_ptx(objects, ptx_arch, name)
        found = ptx_entry(ptx)
        if found is None:
            raise KernelCompileError(f"kernel {name!r}: the PTX nvJitLink linked has no kernel entry", compiler_log=ptx)
        entry = found
    elif compiled.cubin is not None:
        cubins[ptx_arch] = compiled.cubin
    for arch in archs:
        if arch not in cubins:
            try:
                cubins[arch], _ = link_cubin(ptx, arch, max_registers, name)
            except (ImportError, OSError) as exc:
                raise KernelCompileError(
                    f"kernel {name!r}: linking cubins needs nvJitLink, which is not usable here ({exc}); "
                    f"pip install 'numba-cuda[cu13]' (or '[cu12]')"
                ) from None
    return ArchImages(layout=layout, ptx_arch=ptx_arch, entry=entry, ptx=ptx, cubins=cubins)
