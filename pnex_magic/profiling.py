"""``pnex.profile(op, *args)`` and ``%%pnex --profile``: one launch of a kernel under
NVIDIA Nsight Compute, read back as the figures that say why it runs as it does.

The notebook's process is never profiled (``ncu`` profiles a process it starts, and
replays the kernel many times): as ``--sanitize`` does, the parent saves the op
(:func:`pnex_magic.save`, a cubin for this GPU, the variant that ran) and the
arguments (``torch.save``), and ``ncu`` runs ``python -m pnex_magic._profile_child
FOLDER``, which loads both and launches the kernel once, with the block and ``Tune``
values the call ran with, through the Python driver launcher.  ``ncu`` profiles that
launch alone (``--kernel-name`` its mangled entry, ``--launch-count 1``), collecting
the sections of :data:`~pnex_magic.ncu.SECTIONS` into a report file that is kept
(open it in Nsight Compute's GUI) and read back twice (:mod:`pnex_magic.ncu`).  The
time is one launch replayed once per pass of the sections, plus ``ncu``'s start
(a few seconds).  ``clock_control="none"`` (the default) leaves the GPU's clocks
as they are, as the report's timings found them.

:class:`KernelProfile` holds the speed-of-light figures, achieved occupancy, the top
stall reasons and the kernel's source lines with the most stall samples (Numba
compiles every pnex kernel with line information, so the lines are the cell's or
the file's own); :meth:`KernelProfile.reason` turns them into the report's "why"
(:func:`attach`), in place of the advice to run a profiler.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import linecache
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from . import cache, ncu
from .artifact import save
from .tc.tensormap import maps_among  # tensor maps hold addresses: the child makes them again
from .definition import KernelDefinition
from .efficiency import Reason
from .errors import ArtifactError, PnexError
from .launch import autotune
from .spec import TensorParam

__all__ = [
    "ProfilerUnavailable", "SourceLine", "KernelProfile", "profile", "profiled", "attach", "with_profile", "ADVICE",
]


class ProfilerUnavailable(PnexError):
    """Nothing to profile with: no ``ncu``, no GPU, or CPU arguments (the message says which)."""


@dataclasses.dataclass(frozen=True)
class SourceLine:
    """One line of the kernel's source and its share of the sampled warp states."""

    line: int
    text: str  #: the line's source ("" where it cannot be read)
    share: float  #: of all the kernel's samples
    stalled_share: float  #: of all the kernel's samples: warps on this line that did not issue
    reason: str | None  #: the stall reason most sampled on this line


#: What to change, by the most sampled stall reason.
ADVICE = {
    "long_scoreboard": "memory latency: keep more independent loads in flight per thread (several elements per thread "
                       "with pnex.Tune, loads before stores) or more warps per SM; data read more than once can come "
                       "from shared memory",
    "lg_throttle": "too many memory instructions: move more bytes per instruction with pnex.vload/pnex.vstore",
    "short_scoreboard": "shared-memory or special-function latency: keep reused values in registers, and use "
                        "fastmath for sqrt, exp and division",
    "mio_throttle": "shared-memory or special-function throughput: fewer shared accesses per result, conflict-free "
                    "shared layouts",
    "wait": "dependent arithmetic: give each thread independent work to interleave (several elements per thread), or "
            "fewer instructions",
    "math_pipe_throttle": "a math pipe is saturated: fewer instructions of that kind per result; for matrix products, "
                          "the tensor cores (pnex.tc)",
    "barrier": "warps wait at cuda.syncthreads(): balance the work between barriers, or fit more blocks per SM so that "
               "others run meanwhile",
    "membar": "memory fences: fewer of them",
    "no_instructions": "instruction fetch: a smaller (less unrolled) body, fewer divergent branches",
    "branch_resolving": "branches: fewer divergent branches",
    "imc_miss": "constant-cache misses: fewer distinct constants read per warp",
    "not_selected": "warps are ready to issue and wait their turn: the SMs issue about as fast as they can; fewer "
                    "instructions per result is what helps",
    "gmma": "the warpgroup matrix multiplies are the limit: the tensor cores are busy",
}


@dataclasses.dataclass(frozen=True)
class KernelProfile:
    """Nsight Compute's figures of one launch of a pnex kernel (or why there are none)."""

    kernel: str  #: the kernel's Python name
    figures: ncu.Figures | None  #: ``None``: not profiled, :attr:`note` says why
    hot_lines: tuple[SourceLine, ...] = ()  #: most sampled first
    report_path: str = ""  #: the ``.ncu-rep`` file (Nsight Compute's GUI opens it)
    command: tuple[str, ...] = ()
    version: str = ""  #: ncu's
    note: str = ""  #: why there is no profile, or what it lacks
    raw_csv: str = dataclasses.field(default="", repr=False)
    source_csv: str = dataclasses.field(default="", repr=False)

    @classmethod
    def unavailable(cls, kernel: str, why: str) -> KernelProfile:
        return cls(kernel, None, note=why)

    @property
    def ok(self) -> bool:
        return self.figures is not None

    def reason(self) -> Reason | None:
        """The report's "why" from the figures: how busy memory and compute were, the
        occupancy, the top stall reason and the line where warps stall most."""
        f = self.figures
        if f is None:
            return None
        parts = []
        if f.memory_sol is not None and f.compute_sol is not None:
            parts.append(f"memory at {f.memory_sol:.0%} and compute at {f.compute_sol:.0%} of their speed of light")
        if f.achieved_occupancy is not None:
            theory = f" of {f.theoretical_occupancy:.0%} possible" if f.theoretical_occupancy is not None else ""
            parts.append(f"achieved occupancy {f.achieved_occupancy:.0%}{theory}")
        top = f.stalls[0] if f.stalls else None
        if top is not None:
            parts.append(f"warps stall most on {top.name}, {top.share:.0%} of samples: {top.meaning}")
        hot = next((line for line in self.hot_lines if line.text), None)
        if hot is not None:
            parts.append(f"most at line {hot.line}, `{hot.text}` ({hot.share:.0%} of samples)")
        finding = "Nsight Compute: " + "; ".join(parts)
        if f.memory_sol is not None and f.memory_sol >= 0.8:
            advice = "memory is near its speed of light: the kernel is memory-bound; move fewer bytes"
        elif f.compute_sol is not None and f.compute_sol >= 0.8:
            advice = "the SMs are near their speed of light: the kernel is compute-bound; fewer instructions per result"
        else:
            advice = ADVICE.get(top.name if top else "", "see Nsight Compute's Profiling Guide, 'Warp Stall Reasons'")
            if f.memory_sol is not None and f.compute_sol is not None and max(f.memory_sol, f.compute_sol) < 0.6:
                advice = f"neither memory nor compute is busy (latency-bound): {advice}"
        return Reason("profile", finding, advice)

    def lines(self) -> list[str]:
        f = self.figures
        if f is None:
            return [f"profile   : not profiled: {self.note}"]
        pct = (lambda v: "n/a" if v is None else f"{v:.0%}")
        out = [f"profile   : Nsight Compute {self.version}, one launch of {self.kernel} on {f.device or 'the GPU'}"
               + (f", {f.duration * 1e6:.1f} µs" if f.duration else ""),
               f"  speed of light: memory {pct(f.memory_sol)}, compute {pct(f.compute_sol)}, DRAM {pct(f.dram_sol)}"
               + (f", tensor pipe {pct(f.tensor_pipe)}" if f.tensor_pipe else ""),
               f"  occupancy : {pct(f.achieved_occupancy)} achieved, {pct(f.theoretical_occupancy)} theoretical"]
        for s in f.stalls[:3]:
            out.append(f"  stall     : {s.name}, {s.share:.0%} of samples: {s.meaning}")
        for line in self.hot_lines[:3]:
            why = f", mostly {line.reason}" if line.reason else ""
            out.append(f"  line {line.line:<4} : {line.share:.0%} of samples{why}: {line.text}")
        if self.note:
            out.append(f"  note      : {self.note}")
        if self.report_path:
            out.append(f"  report    : {self.report_path} (ncu-ui opens it)")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text("KernelProfile(...)" if cycle else str(self))

    def _repr_html_(self) -> str:
        from .render.profile import profile_html  # the render stage draws it (it imports nothing of this one)

        return profile_html(self)


# ----------------------------------------------------------------------------- source lines


def hot_lines(counters: Sequence[ncu.LineCounters], fn: Any, limit: int = 5) -> tuple[SourceLine, ...]:
    """The lines of ``fn``'s source file (the kernel's, and the device functions' it
    inlines from the same file or cell) with the most samples, each with its text and
    top stall reason."""
    total = sum(c.samples for c in counters) or 1.0
    code = getattr(fn, "__code__", None)
    filename = code.co_filename if code is not None else None

    def own(c: ncu.LineCounters) -> bool:
        if filename is None:
            return True
        return c.file == filename or os.path.basename(c.file) == os.path.basename(filename)

    ranked = sorted((c for c in counters if own(c) and c.samples > 0),
                    key=lambda c: (-(c.stalled or c.samples), c.line))
    out = []
    for c in ranked[:limit]:
        text = linecache.getline(filename, c.line).strip() if filename else ""
        out.append(SourceLine(c.line, text, c.samples / total, c.stalled / total, c.top_reason()))
    return tuple(out)


# ----------------------------------------------------------------------------- running


def _line_table_note(compiled: Any) -> str:
    """Why Nsight Compute can map no stall to a line of the kernel, where it cannot: a
    PTX without ``.loc`` directives, or a cubin without a line table (a kernel linked
    from LTO-IR beside NVRTC's float16/bfloat16 helpers is compiled without line
    information: their debug module flags and its own would conflict, which nvJitLink
    refuses to link; :func:`pnex_magic.compiler.ltoir_objects`)."""
    if ".loc" not in compiled.ptx:
        return "the kernel was compiled without line information: no source lines"
    if compiled.cubin and b".debug_line" not in compiled.cubin:
        return ("the kernel's cubin has no line table (a kernel linked from LTO-IR beside NVRTC's float16/bfloat16 "
                "helpers is compiled without line information): no source lines")
    return ""


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.pop("PYTHONOPTIMIZE", None)
    env["PNEX_LAUNCHER"] = "driver"  # the child launches through the driver API: no C++ launcher to build there
    return env


def _device(args: Sequence[Any]) -> torch.device:
    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
    if device is None:
        raise ProfilerUnavailable(
            "profiling needs a GPU: the arguments hold no CUDA tensor (CPU tensors run in the CUDA simulator, which "
            "Nsight Compute cannot see); pass CUDA tensors"
            + ("" if torch.cuda.is_available() else ", on a machine with an NVIDIA GPU")
        )
    return device


def _launch_of(definition: Any, op: Any, args: Sequence[Any]) -> tuple[tuple[int, ...], dict[str, Any], str]:
    """The block, the ``Tune`` values and the layout a call on ``args`` runs with (an
    autotuned op is called once first, so that its choice for this key is made)."""
    spec = definition.spec
    tensors = [a for p, a in zip(spec.arguments, args) if isinstance(p, TensorParam)]
    layout = "C" if all(t.is_contiguous() for t in tensors) else "A"
    if not spec.autotuned:
        return tuple(spec.threads_per_block), spec.tune_values(0), layout
    tuned = autotune.result_for(definition, args)
    if tuned is None:
        with torch.no_grad():
            op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        torch.cuda.synchronize()
        tuned = autotune.result_for(definition, args)
    if tuned is None:
        return tuple(spec.threads_per_block), spec.tune_values(0), layout
    return tuple(tuned.block), dict(tuned.tune), layout


def _save(op: Any, path: Path, arch: str, tuned: bool) -> None:
    """The op as an artifact for the child: the tuned ``Tune`` values' code where there
    are some, else every variant's."""
    try:
        try:
            save(op, path, archs=[arch], tuned_only=tuned)
        except ArtifactError:
            if not tuned:
                raise
            save(op, path, archs=[arch])  # no tuned choice recorded: every variant
    except ArtifactError as exc:
        raise PnexError(f"the profile runs the kernel in a child process from a saved copy of the op, and {exc}") \
            from None


def _run(argv: list[str], timeout: float, what: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise PnexError(f"Nsight Compute ran past {timeout:.0f} s while {what}") from None
    except OSError as exc:
        raise ProfilerUnavailable(f"could not run {argv[0]}: {exc}") from None


def _failure(done: subprocess.CompletedProcess, name: str) -> PnexError:
    text = (done.stdout + "\n" + done.stderr).strip()
    tail = "\n".join(text.splitlines()[-12:])
    if "ERR_NVGPUCTRPERM" in text:
        return ProfilerUnavailable(
            "Nsight Compute may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): run as root, or "
            "have the driver loaded with NVreg_RestrictProfilingToAdminUsers=0")
    if "No kernels were profiled" in text:
        return PnexError(f"Nsight Compute profiled no launch of {name}(); what it printed:\n{tail}")
    return PnexError(f"Nsight Compute failed on {name}() (exit status {done.returncode}); what it printed:\n{tail}")


def profile(op: Any, *args: Any, clock_control: str = "none", timeout: float = 600.0) -> KernelProfile:
    """Run ``op(*args)``'s kernel once under Nsight Compute and return its figures.

    Parameters
    ----------
    op : PnexOp
        An op made by ``pnex.jit`` or ``%%pnex`` (its Python source maps the stalls to
        lines).
    *args
        The op's arguments, CUDA tensors and scalars, as for a call.
    clock_control : "none" or "base"
        ``"none"`` (default) leaves the GPU's clocks alone; ``"base"`` lets ncu lock
        them to the base clock while it profiles.
    timeout : float
        Seconds for ncu's run.

    Raises
    ------
    ProfilerUnavailable
        No ``ncu``, CPU arguments, or no permission to read the counters: the message
        says how to get what is missing.
    PnexError
        ncu failed or profiled nothing: the message holds what it printed.
    """
    definition = getattr(op, "_pnex", None)
    if not isinstance(definition, KernelDefinition):
        raise PnexError(
            f"pnex.profile() profiles an op made by pnex.jit or %%pnex (with its Python source), got {op!r}")
    name = definition.spec.name
    device = _device(args)
    tool = ncu.find_ncu()
    if tool is None:
        raise ProfilerUnavailable(ncu.NCU_ADVICE)
    arch = "sm_%d%d" % torch.cuda.get_device_capability(device)
    block, tune, layout = _launch_of(definition, op, args)
    variant = definition.spec.tune_variants.index(tuple(tune[p.name] for p in definition.spec.tune_params))
    compiled = definition.compiled(arch, layout=layout, variant=variant)
    note = _line_table_note(compiled)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = cache.folder("profiles")
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / f"{name}-{stamp}-{os.getpid()}.ncu-rep"
    with tempfile.TemporaryDirectory(prefix="pnex-profile-") as tmp:
        work = Path(tmp)
        _save(op, work / "kernel.pnex", arch, bool(definition.spec.tune_params))
        values = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
        torch.save({"args": values, "cuda": [isinstance(a, torch.Tensor) and a.is_cuda for a in args],
                    "maps": maps_among(args)}, work / "args.pt")
        (work / "launch.json").write_text(json.dumps(
            {"block": list(block), "tune": tune, "entry": compiled.entry, "device": device.index or 0}))
        program = [sys.executable, "-m", "pnex_magic._profile_child", str(work)]
        argv = ncu.profile_command(tool, report, compiled.entry, program, clock_control=clock_control)
        done = _run(argv, timeout, f"profiling {name}()", _child_env())
    if not report.exists():
        raise _failure(done, name)
    reads = {}
    for page, command in ncu.import_commands(tool, report).items():
        read = _run(command, timeout, f"reading its report ({page})")
        if read.returncode != 0:
            raise _failure(read, name)
        reads[page] = read.stdout
    kernels = ncu.parse_raw(reads["raw"])
    if not kernels:
        raise PnexError(f"Nsight Compute's report of {name}() holds no launch; its raw page:\n{reads['raw'][-2000:]}")
    version = _run([tool, "--version"], 60, "asking its version").stdout
    found = ncu.parse_source(reads["source"])
    lines = hot_lines(found, definition.fn)
    if not lines and not note:
        note = "no samples on the kernel's own lines (SourceCounters)"
    return KernelProfile(
        kernel=name, figures=ncu.figures(kernels[-1]), hot_lines=lines, report_path=str(report),
        command=tuple(argv), version=_version(version), note=note, raw_csv=reads["raw"], source_csv=reads["source"],
    )


def _version(text: str) -> str:
    for word in text.split():
        if word[:1].isdigit() and word.count(".") >= 2:
            return word
    return ""


# ----------------------------------------------------------------------------- the report


def with_profile(efficiency: Any, profile_: KernelProfile | None) -> Any:
    """``efficiency`` (an :class:`~pnex_magic.efficiency.Efficiency`) with the profile's
    reason: the first where the report's own figures found none (in place of the
    advice to profile), else after them."""
    reason = profile_.reason() if profile_ is not None else None
    if efficiency is None or reason is None or not efficiency.far:
        return efficiency
    return dataclasses.replace(efficiency, reasons=(*efficiency.reasons, reason))


def attach(report: Any, profile_: KernelProfile) -> Any:
    """``report`` (a :class:`~pnex_magic.report.KernelReport`) with ``profile_`` and its reason."""
    return dataclasses.replace(report, profile=profile_, efficiency=with_profile(report.efficiency, profile_))


def profiled(report: Any, op: Any, args: Sequence[Any], **options: Any) -> Any:
    """``%%pnex --profile``: ``report`` with the profile of ``op(*args)``, or with a note
    that says why there is none (no GPU, no ncu, ncu's failure): the rest of the report
    stands either way."""
    try:
        found = profile(op, *args, **options)
    except PnexError as exc:
        found = KernelProfile.unavailable(op._pnex.spec.name, str(exc))
    return attach(report, found)
