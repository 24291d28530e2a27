"""Report stage: what was built, and how it ran, as one plain result object.

:func:`build_report` gathers, for a pnex op, the signature and schema, the launch
configuration (and, for example arguments, the concrete grid), the PTX, the SASS,
the resource usage and theoretical occupancy, and, with example arguments and an
eager reference, the correctness check and the timings
(:mod:`pnex_magic.timing`), the autotuner's choice of block
(:mod:`pnex_magic.launch.autotune`) and how close the op came to the device's
bandwidth ceilings (:mod:`pnex_magic.efficiency`).  Every front end uses it: :func:`inspect` (no GPU
needed), the ``%%pnex`` magic (which renders it, :mod:`pnex_magic.render`), and
the JAX front end.  The result prints readably in a REPL (``_repr_pretty_``) and
as text (``str``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect as _inspect
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import ceiling, hardware, roofline
from . import timing as _timing
from .calls import LaunchInfo, bind_arguments, launch_info, output_shapes
from .compiler import CompiledKernel
from .definition import KernelDefinition
from .efficiency import (
    Efficiency, LaunchFacts, assess, element_bytes, input_bytes, read_share, reasons, strided_along_x,
)
from .errors import KernelDefinitionError, KernelLaunchError, PnexError
from .hardware import occupancy
from .launch import autotune, is_fault, switch
from .launch.autotune import TuneResult
from .op import NAMESPACE, PnexOp
from .spec import TensorParam
from .sass import Disassembly, PendingDisassembly, disassemble
from .tune_template import tune_template

__all__ = ["KernelReport", "build_report", "inspect", "occupancy", "sass_summary", "STAND_IN"]

#: What the report says of the architecture it shows where no GPU is (``KernelReport.stand_in``).
STAND_IN = "a stand-in compile target: no GPU here, the op runs in the CUDA simulator"


def sass_summary(found: Disassembly) -> str:
    """``168 lines (cuobjdump); the kernel first, then 1 helper function`` or why there is none."""
    if not found:
        return found.reason
    helpers = len(found.functions) - 1
    tail = f"; the kernel first, then {helpers} helper function{'s' if helpers != 1 else ''}" if helpers > 0 else ""
    return f"{found.line_count} lines ({found.tool}){tail}"


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
    candidates: tuple[tuple[int, ...], ...] = ()  #: autotune candidates (empty: the block is fixed)
    #: the Tune parameters and their choices, e.g. (("ITEMS", (1, 2, 4, 8)),)
    tune: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    #: ``tune_requires``: the combinations kept (of all), and the rules that choose per call
    tune_kept: tuple[int, int] | None = None
    tune_per_call: tuple[str, ...] = ()
    autotune: TuneResult | None = None  #: how the block for the example arguments was chosen
    efficiency: Efficiency | None = None  #: bandwidth against the device's ceilings, when timed
    checked_run: str = ""  #: what a checked run on the example arguments found (``check_first``)
    #: the FLOP count of a call and, when timed, its rate against the compute peak (example arguments)
    compute: roofline.Compute | None = None
    #: Nsight Compute's figures of one launch (``%%pnex --profile``: a pnex_magic.profiling.KernelProfile)
    profile: Any = None
    #: no CUDA GPU here and no architecture asked for: ``arch`` is a stand-in compile target (the PTX, SASS,
    #: registers and occupancy are its), and the op runs in the CUDA simulator
    stand_in: bool = False
    #: dynamic shared memory per block (``shared_bytes=``) of the ``Tune`` variant shown, in bytes
    dynamic_shared_bytes: int = 0
    shared_bytes_text: str = "0"  #: the ``shared_bytes`` option as written (an expression over Tune parameters)

    @property
    def shared_total(self) -> int | None:
        """Shared memory per block, static (ptxas) plus dynamic (``None``: static unknown)."""
        return None if self.shared_bytes is None else self.shared_bytes + self.dynamic_shared_bytes

    @property
    def spills(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)

    def lines(self) -> list[str]:
        def fmt(v: Any, unit: str = "") -> str:
            return "n/a (nvJitLink unavailable)" if v is None else f"{v}{unit}"

        tpb = f"threads_per_block={self.threads_per_block}"
        if self.candidates:
            tpb = f"autotuned over {len(self.candidates)} candidates, first {self.threads_per_block}"
        tuned = [(n, c) for n, c in self.tune if len(c) > 1]
        if tuned:
            blocks = f"{len(self.candidates)} blocks" if self.candidates else f"block {self.threads_per_block}"
            choices = "; ".join(f"{n}: {', '.join(map(repr, c))}" for n, c in tuned)
            tpb = f"autotuned over {blocks} x Tune ({choices})"
            if self.tune_kept and self.tune_kept[0] < self.tune_kept[1]:
                tpb += f", {self.tune_kept[0]} of {self.tune_kept[1]} combinations kept by tune_requires"
            if self.tune_per_call:
                tpb += f", per call: {'; '.join(self.tune_per_call)}"
        constants = [f"{n}={c[0]!r}" for n, c in self.tune if len(c) == 1]
        if constants:
            tpb += f"; Tune constants {', '.join(constants)}"
        out = [
            f"pnex kernel {self.name!r} ({self.op_name})",
            f"  signature : {self.signature}",
            f"  schema    : {self.schema}",
            f"  launch    : n_threads={self.n_threads} {tpb}",
        ]
        if self.grid is not None:
            out.append(f"  grid      : {self.grid} blocks x {self.block} threads")
        if self.autotune is not None:
            out += ["  " + line for line in self.autotune.lines()]
        how = "cache hit" if self.cache_hit else f"compiled in {self.compile_seconds:.2f} s"
        if self.stand_in:
            how = f"{STAND_IN}; {how}"
        out += [
            f"  target    : {self.arch} ({how})",
            f"  registers : {fmt(self.registers, ' per thread')}"
            + (
                f"  (max_registers={self.max_registers} is below ptxas's minimum for {self.arch})"
                if self.max_registers and self.registers and self.registers > self.max_registers
                else ""
            ),
            f"  shared    : {fmt(self.shared_bytes, ' B')}" + (
                f" static + {self.dynamic_shared_bytes:,} B dynamic (shared_bytes = {self.shared_bytes_text})"
                if self.dynamic_shared_bytes else ""),
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
            out.append(f"  sass      : {sass_summary(self.sass)}")
        if self.checked_run:
            out.append(f"  checked   : {self.checked_run}")
        if self.timing is not None:
            unit = self.efficiency.unit if self.efficiency is not None else None
            out += ["  " + line for line in self.timing.lines(unit)]
        if self.efficiency is not None:
            out += ["  " + line for line in self.efficiency.lines()]
        if self.compute is not None:
            out += ["  " + line for line in self.compute.lines()]
        if self.profile is not None:
            out += ["  " + line for line in self.profile.lines()]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("KernelReport(...)" if cycle else str(self))


def _definition_of(op: Any, who: str) -> KernelDefinition:
    inner = getattr(op, "op", None)  # a wrapper in front of an op (a JAX function, a shape check): the op
    if not isinstance(op, PnexOp) and isinstance(inner, PnexOp):
        op = inner
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


def _uses_cache(definition: Any) -> bool:
    """Whether the kernel's options let its SASS listing be kept in the cache folder."""
    return getattr(definition.options, "use_cache", True)


def _run_op(op: PnexOp, args: Sequence[Any], args_name: str) -> tuple[Any, tuple[Any, ...]]:
    copies = _timing.clone_args(args)
    name = op._pnex.spec.name
    try:
        with torch.no_grad():
            result = op(*copies)
        device = next((a.device for a in copies if isinstance(a, torch.Tensor) and a.is_cuda), None)
        if device is not None:
            torch.cuda.synchronize(device)  # a fault of this kernel surfaces here, where it is known
        return result, copies
    except PnexError as exc:
        exc.args = (f"{args_name}: {exc}",) + tuple(exc.args[1:])
        raise
    except Exception as exc:
        if is_fault(exc):
            raise KernelLaunchError(
                f"{args_name}: kernel {name!r} faulted on them: {str(exc).strip().splitlines()[0]}. After a fault "
                f"the GPU context is unusable: restart the Python process (the notebook's kernel)"
            ) from None
        raise PnexError(f"{args_name}: calling {name} on them raised {type(exc).__name__}: {exc}") from None


def _run_checked(op: PnexOp, args: Sequence[Any], args_name: str) -> str:
    """One checked launch of ``op`` on copies of ``args`` (:mod:`pnex_magic.checking`):
    raises its ``KernelIndexError`` (the CUDA context survives), else says how long it took."""
    import time

    from .launch import checks

    start = time.perf_counter()
    with checks.checked_launches(op._pnex):
        _run_op(op, args, args_name)
    took = time.perf_counter() - start
    return (f"a checked run on {args_name} found no access out of bounds ({_checked_accesses(op)}; "
            f"{took * 1e3:.1f} ms, compile of the checked variant included); timings and later calls use the "
            f"fast variant")


def _checked_accesses(op: PnexOp) -> str:
    """How many of the kernel's accesses its checked variant tests, and how many the
    source proves in bounds (:mod:`pnex_magic.checking.index_ranges`)."""
    variant = op._pnex.checked_kernel()
    tested, proven = len(variant.sites), len(variant.proven)
    if not tested:
        return f"all {proven} accesses proven in bounds from the source, none left to test"
    text = f"{tested} access{'' if tested == 1 else 'es'} tested"
    return text + (f", {proven} more proven in bounds from the source" if proven else "")


def _run_eager(eager: Callable, args: Sequence[Any], eager_name: str, args_name: str) -> tuple[Any, tuple[Any, ...]]:
    copies = _timing.clone_args(args)
    try:
        with torch.no_grad():
            return eager(*copies), copies
    except Exception as exc:
        raise PnexError(f"{eager_name}: calling it on {args_name} raised {type(exc).__name__}: {exc}") from None


#: What a timing says while the C++ launcher is built (:func:`pnex_magic.launch.switch.waiting`).
GRAPH_TIMED = ("timed as CUDA-graph replays, the op and the reference alike (the C++ launcher is being built "
               "and the Python launcher's cost per call is left out: the cell's next run times plain calls)")


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
    sass: bool | str = True,
    args_name: str = "the example arguments",
    eager_name: str | None = None,
    progress: Callable[[str], None] | None = None,
    check_first: bool = False,
) -> KernelReport:
    """Everything about ``op``: interface, launch, PTX, SASS, resources and, with
    example ``args``, the concrete grid, a run of the op checked against ``eager``
    (results compared in float64) and, on CUDA tensors, timings of both.

    ``arch`` picks the architecture the PTX and resources are shown for (default:
    the op's target); ``sass="later"`` leaves a
    :class:`~pnex_magic.sass.PendingDisassembly` in the report's ``sass``, to be filled
    in once the report is shown.  ``time`` defaults to "the arguments are CUDA tensors".
    ``args_name`` and ``eager_name`` say how errors name the arguments and the
    reference (the magic passes its option text).  ``progress(step)`` is called
    before each slow step.  ``check_first``: on CUDA arguments, run the op's checked
    variant once before anything else (a bug raises ``KernelIndexError`` before the
    fast variant ever runs, and the CUDA context survives).  Errors: a wrong argument
    raises the package's exception for it; an op or reference that fails on the
    arguments raises :class:`~pnex_magic.PnexError` naming which.
    """
    definition = _definition_of(op, "pnex.build_report()")
    step = progress or (lambda text: None)
    spec = definition.spec
    name = spec.name
    timing_result = None
    launch = None
    tuned = efficiency = None
    checked_run = ""
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
        if check_first and device_arch is not None and definition.compiles and not definition.options.check:
            step(f"running {name}'s checked variant on {args_name}")
            checked_run = _run_checked(op, args, args_name)
        elif definition.options.check and device_arch is not None:
            checked_run = "every launch is checked (check=True): timings are the checked variant's"
        step(f"running {name} on {args_name}")
        op_run = _run_op(op, args, args_name)
        if eager is not None or device_arch is not None:
            step("checking against eager" + (" and timing on the GPU" if device_arch is not None else ""))
        mutated = [i for i, p in enumerate(spec.arguments) if p.role == "inmut"]
        evaluate = functools.partial(
            _timing.evaluate, op, args, eager,
            output_names=[p.name for p in spec.outputs],
            mutated=mutated,
            mutated_names=[spec.arguments[i].name for i in mutated],
            name=name,
            eager_name=eager_name or "eager",
            op_run=op_run,
            eager_run=eager_run,
            time_it=time,
        )
        # While the C++ launcher is built (a fresh environment), the Python launcher's
        # cost per call would be timed instead of the kernel: time CUDA-graph replays.
        in_graphs = device_arch is not None and time is not False and switch.waiting(definition.op_name)
        try:
            timing_result = evaluate(graphs=in_graphs)
        except _timing.CaptureRefused:  # the op or the reference cannot be captured: time plain calls
            in_graphs = False
            timing_result = evaluate()
        # The block the op ran with (an autotuned op's choice for the arguments it ran
        # on: copies, whose layout may differ from a strided original's).
        ran = op_run[1]
        tuned = autotune.result_for(definition, ran)
        if tuned is not None:
            launch = launch_info(spec, ran, tuned.block, tuned.variant)
        if timing_result.timed and device_arch is not None:
            through = (GRAPH_TIMED if in_graphs else switch.timing_note(definition.op_name))  # the first run
            if through:
                timing_result = dataclasses.replace(timing_result, device=f"{timing_result.device}, {through}")
            step("measuring the device's bandwidth ceiling")
            efficiency = _efficiency(definition, ran, launch, timing_result, device_arch, tuned, op=op)
        compute = _compute(definition, ran, launch, tuned, device_arch or arch, timing_result, efficiency)
        efficiency = roofline.with_compute(efficiency, compute)
    step("inspecting the build")
    variant = tuned.variant if tuned is not None else 0  # the code that ran: its PTX, SASS and resources
    report = _static_report(definition, arch, variant)
    if launch is not None:
        report = dataclasses.replace(_with_launch(report, launch, tuned), timing=timing_result, efficiency=efficiency,
                                     checked_run=checked_run, compute=compute)
    if sass:
        compiled = definition.compiled(arch, variant=variant) if definition.compiles else None
        if not compiled:
            found = Disassembly(None, None, report.not_compiled or "no cubin")
        elif sass == "later":
            found = PendingDisassembly(None, None, PendingDisassembly.NOTE, compiled.cubin, compiled.entry,
                                       _uses_cache(definition))
        else:
            found = disassemble(compiled.cubin, entry=compiled.entry, use_cache=_uses_cache(definition))
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
        tuned = autotune.result_for(definition, tuple(args))
        launch = launch_info(
            definition.spec, tuple(args), tuned.block if tuned is not None else None,
            tuned.variant if tuned is not None else 0,
        )
        report = dataclasses.replace(_with_launch(report, launch, tuned),
                                     compute=_compute(definition, tuple(args), launch, tuned, report.arch))
    return report


def _compute(
    definition: Any, args: Sequence[Any], launch: LaunchInfo, tuned: TuneResult | None, arch: str | None,
    timing: _timing.TimingResult | None = None, efficiency: Efficiency | None = None,
) -> roofline.Compute | None:
    """The FLOP count of the call on ``args`` (the author's, else inferred from the PTX)
    and, for a call timed on the GPU, its rate against the compute peak; ``None``
    where there is no count to give."""
    spec = definition.spec
    variant = tuned.variant if tuned is not None else 0
    env = bind_arguments(spec, args)
    env.update(spec.tune_values(variant))
    env.update({p.name: torch.empty(shape, device="meta")
                for p, shape in zip(spec.outputs, output_shapes(spec, env))})
    compiled = definition.compiled(arch, variant=variant) if definition.compiles else None
    flops, how, inferred, kind = roofline.count_flops(
        spec, getattr(definition, "flops", None), env, launch.n_threads,
        compiled.ptx if compiled else "", compiled.entry if compiled else "",
    )
    if not flops:  # no count (a loop, no compiler), or no floating-point work: nothing to show
        return None
    timed = timing is not None and timing.timed and efficiency is not None
    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"), None)
    info = hardware.device_info(device) if timed and device is not None else None
    sass_text = ""
    if info is not None and compiled is not None and flops:
        sass_text = disassemble(compiled.cubin, entry=compiled.entry, use_cache=_uses_cache(definition)).text or ""
    return roofline.assess(
        flops=flops, how=how, inferred=inferred, kind=kind,
        seconds=timing.op.median if timed else None, bytes_moved=timing.bytes_moved if timing is not None else None,
        info=info, bandwidth=efficiency.memory_ceiling if efficiency is not None else None, sass=sass_text,
        ptx=compiled.ptx if compiled else "", arch=arch or "",
        dtypes=[p.dtype.name for p in spec.params if isinstance(p, TensorParam)],
    )


def _with_launch(report: KernelReport, launch: LaunchInfo, tuned: TuneResult | None) -> KernelReport:
    """The report with a call's launch: its grid and block (the autotuner's choice for
    an autotuned op) and the occupancy of that block."""
    occ = report.occupancy
    if tuned is not None and report.registers is not None:
        occ = occupancy(report.arch, report.registers, report.shared_total or 0, math.prod(launch.block))
    return dataclasses.replace(
        report, grid=launch.grid, block=launch.block, n_threads_values=launch.n_threads, autotune=tuned, occupancy=occ
    )


def _efficiency(
    definition: Any, args: Sequence[Any], launch: LaunchInfo, timing: _timing.TimingResult, device_arch: str,
    tuned: TuneResult | None = None, op: PnexOp | None = None,
) -> Efficiency:
    """The op's bandwidth against the GPU's ceilings, with the facts for the reasons."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda")
    info = hardware.device_info(device)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    layout = "C" if all(t.is_contiguous() for t in tensors) else "A"
    variant = tuned.variant if tuned is not None else 0  # the Tune values the call ran with
    res = definition.compiled(device_arch, layout=layout, variant=variant).resources if definition.compiles else None
    streams = ceiling.measure(device)  # torch's streaming kernels, once per process
    memory = ceiling.ceiling_at(streams, read_share(definition.spec, args, timing.bytes_moved))
    copy = next((s.bandwidth for s in streams if s.name == "copy"), None)
    facts = LaunchFacts(
        arch=device_arch,
        registers=res.registers if res else None,
        shared_bytes=res.shared_bytes + definition.spec.shared_of(variant) if res else None,  # static + dynamic
        spill_store_bytes=res.spill_store_bytes if res else None,
        spill_load_bytes=res.spill_load_bytes if res else None,
        block=launch.block,
        grid=launch.grid,
        sm_count=info.sm_count,
        op_seconds=timing.op.median,
        bytes_moved=timing.bytes_moved,
        strided=strided_along_x(definition.spec, args),
        x_extent=launch.n_threads[0],
        input_bytes=input_bytes(definition.spec, args),
        ceiling_bandwidth=memory.bandwidth if memory is not None else copy or info.peak_bandwidth,
        tune=tuned.tune if tuned is not None else (),
        element_bytes=element_bytes(definition.spec, args),
        template=tune_template(definition.spec, _source(definition)),
    )
    if op is not None and any(r.kind == "launch" for r in reasons(facts)):
        # CUDA graphs are advised only where a replay of the call measures faster than a call.
        facts = dataclasses.replace(facts, graph_seconds=_graph_seconds(op, args, device))
    return assess(timing, info, copy, facts, memory)


def _graph_seconds(op: PnexOp, args: Sequence[Any], device: Any) -> float | None:
    """Seconds per call of ``op`` on copies of ``args``, calls captured in a CUDA graph and
    replayed (median of 5 replays of 20 calls); ``None`` where the op cannot be captured."""
    copies = _timing.clone_args(args)
    try:
        with torch.no_grad():
            return _timing.measure(lambda: op(*copies), _timing.cuda_graph_timer(device), repeat=5, loops=20).median
    except _timing.CaptureRefused:
        return None


def _source(definition: Any) -> str:
    try:
        return _inspect.getsource(definition.fn)
    except (OSError, TypeError, AttributeError):
        return ""


def _static_report(definition: Any, arch: str | None, variant: int = 0) -> KernelReport:
    """The report of the build (``variant``: which ``Tune`` values' code)."""
    compiled: CompiledKernel | None = definition.compiled(arch, variant=variant) if definition.compiles else None
    spec = definition.spec
    res = compiled.resources if compiled else None
    tpb = math.prod(spec.threads_per_block)
    dynamic = spec.shared_of(variant)  # cuda.shared.array(0, dtype): counts toward occupancy like static
    try:
        source = _inspect.getsource(definition.fn)
    except (OSError, TypeError, AttributeError):
        source = ""
    not_compiled = ""
    if compiled is None:
        not_compiled = f"no CUDA compiler ({definition.toolchain_error}); the op runs on CPU tensors through the simulator"
    stand_in = (arch is None and definition.options.arch is None and not os.environ.get("PNEX_ARCH")
                and not torch.cuda.is_available())
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
        occupancy=occupancy(compiled.arch, res.registers, res.shared_bytes + dynamic, tpb) if compiled and res else None,
        cache_hit=compiled.cache_hit if compiled else False,
        compile_seconds=compiled.compile_seconds if compiled else 0.0,
        cache_key=compiled.key if compiled else "",
        link_log=compiled.link_log if compiled else "",
        to_extension=definition.options.to_extension,
        max_registers=definition.options.max_registers,
        not_compiled=not_compiled,
        candidates=spec.candidates,
        tune=tuple((p.name, p.choices) for p in spec.tune_params),
        tune_kept=(len(spec.tune_variants), math.prod(len(p.choices) for p in spec.tune_params)),
        tune_per_call=tuple(r.text for r in spec.call_tune_rules),
        stand_in=stand_in,
        dynamic_shared_bytes=dynamic,
        shared_bytes_text=str(spec.shared_bytes),
    )
