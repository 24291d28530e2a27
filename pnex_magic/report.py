"""Report stage: what was built, and how it ran, as one plain result object.

:func:`build_report` gathers, for a pnex op, the signature and schema, the launch
configuration (and, for example arguments, the concrete grid), the PTX, the SASS,
the resource usage and theoretical occupancy, and, with example arguments and an
eager reference, the correctness check and the timings
(:mod:`pnex_magic.timing`).  Every front end uses it: :func:`inspect` (no GPU
needed), the ``%%pnex`` magic (which renders it, :mod:`pnex_magic.render`), and
the JAX front end.  The result prints readably in a REPL (``_repr_pretty_``) and
as text (``str``).
"""

from __future__ import annotations

import dataclasses
import inspect as _inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import timing as _timing
from .calls import launch_info
from .arch import parse_arch
from .compiler import CompiledKernel
from .definition import KernelDefinition
from .errors import KernelDefinitionError, PnexError
from .op import NAMESPACE, PnexOp
from .sass import Disassembly, disassemble

__all__ = ["KernelReport", "build_report", "inspect", "occupancy"]

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
    n_threads_values: tuple[int, ...] | None = None  #: ``n_threads`` evaluated for example arguments
    timing: _timing.TimingResult | None = None  #: correctness and timings, for example arguments
    sass: Disassembly = Disassembly(None, None, "not requested")
    not_compiled: str = ""  #: why there is no PTX (no CUDA compiler installed), when there is none

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
        if self.not_compiled:
            out.append(f"  compiled  : no ({self.not_compiled})")
        if self.n_threads_values is not None:
            out.append(f"  n_threads : {self.n_threads_values} for the example arguments")
        if self.sass or self.sass.reason != "not requested":
            sass = f"{len(self.sass.text.splitlines())} lines ({self.sass.tool})" if self.sass else self.sass.reason
            out.append(f"  sass      : {sass}")
        if self.timing is not None:
            out += ["  " + line for line in self.timing.lines()]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("KernelReport(...)" if cycle else str(self))


def _definition_of(op: Any, who: str) -> KernelDefinition:
    definition = getattr(op, "_pnex", None)
    if not isinstance(op, PnexOp) or definition is None:
        raise KernelDefinitionError(f"{who} expects an op made by pnex.jit or %%pnex, got {op!r}")
    if not isinstance(definition, KernelDefinition):
        where = getattr(definition, "origin", "a saved artifact")
        raise KernelDefinitionError(
            f"{who}: {op!r} was loaded from {where}, which holds its compiled code but not its Python "
            f"source; build the report where the kernel is defined"
        )
    return definition


def _run_op(op: PnexOp, args: Sequence[Any], args_name: str) -> tuple[Any, tuple[Any, ...]]:
    copies = _timing.clone_args(args)
    try:
        with torch.no_grad():
            return op(*copies), copies
    except PnexError as exc:
        exc.args = (f"{args_name}: {exc}",) + tuple(exc.args[1:])
        raise
    except Exception as exc:
        raise PnexError(
            f"{args_name}: calling {op._pnex.spec.name} on them raised {type(exc).__name__}: {exc}"
        ) from None


def _run_eager(eager: Callable, args: Sequence[Any], eager_name: str, args_name: str) -> tuple[Any, tuple[Any, ...]]:
    copies = _timing.clone_args(args)
    try:
        with torch.no_grad():
            return eager(*copies), copies
    except Exception as exc:
        raise PnexError(f"{eager_name}: calling it on {args_name} raised {type(exc).__name__}: {exc}") from None


def _device_arch(args: Sequence[Any]) -> str | None:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(a.device)
            return f"sm_{major}{minor}"
    return None


def build_report(
    op: PnexOp,
    *,
    arch: str | None = None,
    args: Sequence[Any] | None = None,
    eager: Callable[..., Any] | None = None,
    time: bool | None = None,
    sass: bool = True,
    args_name: str = "the example arguments",
    eager_name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> KernelReport:
    """Everything about ``op``: interface, launch, PTX, SASS, resources and, with
    example ``args``, the concrete grid, a run of the op checked against ``eager``
    (results compared in float64) and, on CUDA tensors, timings of both.

    ``arch`` picks the architecture the PTX and resources are shown for (default:
    the op's target).  ``time`` defaults to "the arguments are CUDA tensors".
    ``args_name`` and ``eager_name`` say how errors name the arguments and the
    reference (the magic passes its option text).  ``progress(step)`` is called
    before each slow step.  Errors: a wrong argument raises the package's exception
    for it; an op or reference that fails on the arguments raises
    :class:`~pnex_magic.PnexError` naming which.
    """
    definition = _definition_of(op, "pnex.build_report()")
    step = progress or (lambda text: None)
    spec = definition.spec
    name = spec.name
    timing_result = None
    launch = None
    if args is not None:
        args = tuple(args)
        try:
            launch = launch_info(spec, args)
        except PnexError as exc:
            exc.args = (f"{args_name}: {exc}",) + tuple(exc.args[1:])
            raise
        eager_label = eager_name or "the eager reference"
        eager_run = None
        if eager is not None:
            step(f"running the eager reference {eager_name or ''}".rstrip())
            eager_run = _run_eager(eager, args, eager_label, args_name)
        device_arch = _device_arch(args)
        if device_arch is not None and definition.compiles:
            # The first GPU launch compiles for the device's architecture: do it before
            # running, so that a caller capturing the compilers' output sees it.
            definition.compiled(device_arch)
        step(f"running {name} on {args_name}")
        op_run = _run_op(op, args, args_name)
        if eager is not None or device_arch is not None:
            step("checking against eager" + (" and timing on the GPU" if device_arch is not None else ""))
        mutated = [i for i, p in enumerate(spec.arguments) if p.role == "inmut"]
        timing_result = _timing.evaluate(
            op, args, eager,
            output_names=[p.name for p in spec.outputs],
            mutated=mutated,
            mutated_names=[spec.arguments[i].name for i in mutated],
            name=name,
            eager_name=eager_name or "eager",
            op_run=op_run,
            eager_run=eager_run,
            time_it=time,
        )
    step("inspecting the build")
    report = _static_report(definition, arch)
    if launch is not None:
        report = dataclasses.replace(
            report, grid=launch.grid, block=launch.block, n_threads_values=launch.n_threads, timing=timing_result
        )
    if sass:
        compiled = definition.compiled(arch) if definition.compiles else None
        found = disassemble(compiled.cubin) if compiled else Disassembly(None, None, report.not_compiled or "no cubin")
        report = dataclasses.replace(report, sass=found)
    return report


def inspect(op: PnexOp, *, arch: str | None = None, args: tuple | None = None) -> KernelReport:
    """Report on ``op`` compiled for ``arch`` (default: the op's target), without
    running it.  With ``args`` (example arguments), the report also gives the
    concrete grid.  Where no CUDA compiler is installed (the op then runs on CPU
    tensors only), the report covers the interface, and its compiler fields are
    empty."""
    definition = _definition_of(op, "pnex.inspect()")
    report = _static_report(definition, arch)
    if args is not None:
        launch = launch_info(definition.spec, tuple(args))
        report = dataclasses.replace(report, grid=launch.grid, block=launch.block, n_threads_values=launch.n_threads)
    return report


def _static_report(definition: Any, arch: str | None) -> KernelReport:
    compiled: CompiledKernel | None = definition.compiled(arch) if definition.compiles else None
    spec = definition.spec
    res = compiled.resources if compiled else None
    tpb = 1
    for t in spec.threads_per_block:
        tpb *= t
    try:
        source = _inspect.getsource(definition.fn)
    except (OSError, TypeError, AttributeError):
        source = ""
    not_compiled = ""
    if compiled is None:
        not_compiled = f"no CUDA compiler ({definition.toolchain_error}); the op runs on CPU tensors through the simulator"
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
        not_compiled=not_compiled,
    )
