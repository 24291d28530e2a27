"""Report stage: what was built, as a plain result object.

:func:`inspect` returns a :class:`KernelReport` (schema, launch configuration,
PTX, resource usage) for a pnex op, compiling for another architecture if
asked.  It needs no GPU.  It prints readably in a REPL (``_repr_pretty_``) and as
text (``str``); the notebook widget (``pnex_magic.widget``) renders the same
object.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .compiler import CompiledKernel
from .errors import KernelDefinitionError
from .op import NAMESPACE, PnexOp, launch_grid

__all__ = ["KernelReport", "inspect", "occupancy"]

# Per-SM limits by compute capability major.minor (CUDA C Programming Guide, table
# "Technical Specifications per Compute Capability").
_SM_LIMITS = {
    (7, 5): dict(threads=1024, blocks=16, regs=65536, smem=65536, warps=32),
    (8, 0): dict(threads=2048, blocks=32, regs=65536, smem=167936, warps=64),
    (8, 6): dict(threads=1536, blocks=16, regs=65536, smem=102400, warps=48),
    (8, 7): dict(threads=1536, blocks=16, regs=65536, smem=167936, warps=48),
    (8, 9): dict(threads=1536, blocks=24, regs=65536, smem=102400, warps=48),
    (9, 0): dict(threads=2048, blocks=32, regs=65536, smem=233472, warps=64),
    (10, 0): dict(threads=2048, blocks=32, regs=65536, smem=233472, warps=64),
    (12, 0): dict(threads=1536, blocks=32, regs=65536, smem=102400, warps=48),
}


def occupancy(arch: str, registers: int, shared_bytes: int, threads_per_block: int) -> float | None:
    """Theoretical occupancy (active warps / maximum warps per SM) for a block size."""
    from .compiler import parse_arch

    cc = parse_arch(arch)
    limits = _SM_LIMITS.get(cc) or _SM_LIMITS.get((cc[0], 0))
    if limits is None or threads_per_block <= 0:
        return None
    warps_per_block = -(-threads_per_block // 32)
    # Registers are allocated per warp in units of 256.
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = limits["regs"] // (regs_per_warp * warps_per_block) if registers else limits["blocks"]
    by_smem = limits["smem"] // shared_bytes if shared_bytes else limits["blocks"]
    by_threads = limits["threads"] // threads_per_block
    blocks = min(limits["blocks"], by_regs, by_smem, by_threads)
    return min(1.0, blocks * warps_per_block / limits["warps"])


@dataclasses.dataclass(frozen=True)
class KernelReport:
    """What pnex built for one kernel on one architecture."""

    name: str
    op_name: str  #: ``pnex::<name>``
    schema: str  #: full torch schema string
    signature: str  #: Python call signature with result types
    source: str
    n_threads: tuple[str, ...]
    threads_per_block: tuple[int, ...]
    arch: str
    ptx: str
    entry: str
    registers: int | None
    shared_bytes: int | None
    local_bytes: int | None
    const_bytes: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    occupancy: float | None
    cache_hit: bool
    compile_seconds: float
    cache_key: str
    link_log: str
    to_extension: bool
    max_registers: int | None
    grid: tuple[int, int, int] | None = None  #: blocks per grid, for example arguments
    block: tuple[int, int, int] | None = None

    @property
    def spills(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)

    def lines(self) -> list[str]:
        def fmt(v: Any, unit: str = "") -> str:
            return "n/a (nvJitLink unavailable)" if v is None else f"{v}{unit}"

        out = [
            f"pnex kernel {self.name!r} ({self.op_name})",
            f"  signature : {self.signature}",
            f"  schema    : {self.schema}",
            f"  launch    : n_threads={self.n_threads} threads_per_block={self.threads_per_block}",
        ]
        if self.grid is not None:
            out.append(f"  grid      : {self.grid} blocks x {self.block} threads")
        out += [
            f"  target    : {self.arch} ({'cache hit' if self.cache_hit else f'compiled in {self.compile_seconds:.2f} s'})",
            f"  registers : {fmt(self.registers, ' per thread')}"
            + (
                f"  (max_registers={self.max_registers} is below ptxas's minimum for {self.arch})"
                if self.max_registers and self.registers and self.registers > self.max_registers
                else ""
            ),
            f"  shared    : {fmt(self.shared_bytes, ' B')}",
            f"  local     : {fmt(self.local_bytes, ' B')}"
            + (f"  (SPILLS: {self.spill_store_bytes} B stored, {self.spill_load_bytes} B loaded)" if self.spills else ""),
        ]
        if self.occupancy is not None:
            out.append(f"  occupancy : {self.occupancy:.0%} (theoretical)")
        out.append(f"  ptx       : {len(self.ptx.splitlines())} lines, entry {self.entry[:48]}...")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("KernelReport(...)" if cycle else str(self))


def inspect(op: PnexOp, *, arch: str | None = None, args: tuple | None = None) -> KernelReport:
    """Report on ``op`` compiled for ``arch`` (default: the op's target).  With
    ``args`` (example arguments), the report also gives the concrete grid.  Where no
    CUDA compiler is installed (the op then runs on CPU tensors only), the report
    covers the interface, and its compiler fields are empty."""
    definition = getattr(op, "_pnex", None)
    if definition is None:
        raise KernelDefinitionError(f"pnex.inspect() expects an op made by pnex.jit or %%pnex, got {op!r}")
    compiled: CompiledKernel | None = None
    if definition.toolchain_error is None:
        compiled = definition.compiled(arch)
    spec = definition.spec
    res = compiled.resources if compiled else None
    tpb = 1
    for t in spec.threads_per_block:
        tpb *= t
    grid = block = None
    if args is not None:
        import torch

        env = {p.name: v for p, v in zip(spec.arguments, args)}
        from .op import output_shapes

        for p, shape in zip(spec.outputs, output_shapes(spec, env)):
            env[p.name] = torch.empty(shape, device="meta")
        grid, block = launch_grid(spec, env)
    import inspect as _inspect

    try:
        source = _inspect.getsource(definition.fn)
    except (OSError, TypeError):
        source = ""
    return KernelReport(
        name=spec.name,
        op_name=f"{NAMESPACE}::{definition.op_name}",
        schema=f"{NAMESPACE}::{definition.op_name}{spec.schema}",
        signature=spec.python_signature(),
        source=source,
        n_threads=tuple(str(e) for e in spec.n_threads),
        threads_per_block=spec.threads_per_block,
        arch=compiled.arch if compiled else definition.target_arch(arch),
        ptx=compiled.ptx if compiled else "",
        entry=compiled.entry if compiled else "",
        registers=res.registers if res else None,
        shared_bytes=res.shared_bytes if res else None,
        local_bytes=res.local_bytes if res else None,
        const_bytes=res.const_bytes if res else None,
        spill_store_bytes=res.spill_store_bytes if res else None,
        spill_load_bytes=res.spill_load_bytes if res else None,
        occupancy=occupancy(compiled.arch, res.registers, res.shared_bytes, tpb) if compiled and res else None,
        cache_hit=compiled.cache_hit if compiled else False,
        compile_seconds=compiled.compile_seconds if compiled else 0.0,
        cache_key=compiled.key if compiled else "",
        link_log=compiled.link_log if compiled else "",
        to_extension=definition.options.to_extension,
        max_registers=definition.options.max_registers,
        grid=grid,
        block=block,
    )
