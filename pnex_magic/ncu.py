"""NVIDIA Nsight Compute (``ncu``): finding it, its command line, and reading its CSV.

:mod:`pnex_magic.profiling` runs one launch of a kernel under ``ncu`` and reads the
report back through two imports of it (no second run of the kernel):

* ``--page raw --csv`` (:func:`parse_raw`): a header row of metric names, a row of
  their units, one row per profiled kernel.  :func:`figures` reads the speed-of-light
  throughputs (``sm__throughput`` for compute, ``gpu__compute_memory_throughput`` for
  memory, ``gpu__dram_throughput``), achieved and theoretical occupancy
  (``sm__warps_active.avg.pct_of_peak_sustained_active``,
  ``sm__maximum_warps_per_active_cycle_pct``), the duration, the tensor pipe's
  utilisation and the warp-stall samples (``smsp__pcsamp_warps_issue_stalled_<why>``,
  from the ``SourceCounters`` section; else the ``WarpStateStats`` section's cycles
  per issued instruction, ``smsp__average_warps_issue_stalled_<why>_per_issue_active``);
* ``--page source --print-source cuda,sass --csv`` (:func:`parse_source`): per source
  file (a ``"File Path"`` row) and function (``"Function Name"``), one row per source
  line with its stall samples, all and not issued, by reason (``stall_long_sb``, ...),
  followed by the rows of its SASS instructions.  Numba emits line information
  (``.loc``) for every kernel pnex compiles, so the lines are the kernel's Python lines.

Both layouts are Nsight Compute 2022.3's (checked by importing a recorded report with
that version's ``ncu``); the parser finds columns by name, so that the columns later
versions add or rename in the same spirit ("Warp Stall Sampling (All Samples)" for
"Sampling Data (All)") are read too, and it skips ``ncu``'s own ``==PROF==`` /
``==WARNING==`` lines.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import io
import os
import re
import shutil
from collections.abc import Mapping, Sequence

__all__ = [
    "NCU_ADVICE", "SECTIONS", "STALLS", "RawKernel", "Stall", "LineCounters", "Figures",
    "find_ncu", "profile_command", "import_commands", "parse_raw", "parse_source", "figures", "stall_name",
]

NCU_ADVICE = (
    "Nsight Compute's command-line profiler (ncu) was not found (on PATH, in $CUDA_HOME/bin, /usr/local/cuda/bin, "
    "/opt/nvidia/nsight-compute/*/ or $PNEX_NCU). It comes with the CUDA toolkit (the nsight-compute package of "
    "NVIDIA's CUDA repositories: apt install nsight-compute-2025.3.1, or cuda-nsight-compute-13-0), with conda "
    "(conda install -c nvidia nsight-compute) and as a standalone installer (developer.nvidia.com/nsight-compute); "
    "put its folder on PATH or set PNEX_NCU to the ncu executable"
)

#: What one profile collects: speed of light, occupancy, warp states, source counters
#: (the sampled stalls per instruction and line) and the pipes' utilisation.
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SourceCounters", "ComputeWorkloadAnalysis")


def _executable(path: str | os.PathLike | None) -> str | None:
    return str(path) if path and os.path.isfile(path) and os.access(path, os.X_OK) else None


def find_ncu() -> str | None:
    """The ``ncu`` executable: ``$PNEX_NCU``, ``PATH``, ``$CUDA_HOME/bin`` (``$CUDA_PATH``),
    ``/usr/local/cuda/bin``, then the newest ``/opt/nvidia/nsight-compute/<version>/ncu``
    and ``/usr/local/cuda*/nsight-compute*/ncu``; ``None`` where there is none."""
    found = _executable(os.environ.get("PNEX_NCU")) or shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and _executable(os.path.join(root, "bin", "ncu")):
            return os.path.join(root, "bin", "ncu")
    for pattern in ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/nsight-compute*/ncu"):
        for hit in sorted(glob.glob(pattern), reverse=True):
            if _executable(hit):
                return hit
    return None


def profile_command(
    ncu: str, report: str | os.PathLike, entry: str, program: Sequence[str], *, clock_control: str = "none",
) -> list[str]:
    """``ncu`` profiling the first launch of the kernel ``entry`` (its mangled name) that
    ``program`` makes, into ``report`` (``.ncu-rep``).  ``clock_control="none"`` leaves
    the GPU's clocks as they are (the report's timings ran at them too); ``"base"``, ncu's
    own default, locks them to the base clock while it profiles."""
    if clock_control not in ("none", "base"):
        raise ValueError(f"clock_control must be 'none' or 'base', got {clock_control!r}")
    argv = [ncu, "--target-processes", "application-only", "--clock-control", clock_control,
            "--kernel-name-base", "mangled", "--kernel-name", entry, "--launch-count", "1",
            "--import-source", "yes", "-f", "-o", str(report)]
    for section in SECTIONS:
        argv += ["--section", section]
    return argv + list(program)


def import_commands(ncu: str, report: str | os.PathLike) -> dict[str, list[str]]:
    """The two reads of a report: ``"raw"`` (every metric) and ``"source"`` (per line)."""
    return {
        "raw": [ncu, "--import", str(report), "--page", "raw", "--csv", "--print-units", "base"],
        "source": [ncu, "--import", str(report), "--page", "source", "--print-source", "cuda,sass", "--csv"],
    }


# ----------------------------------------------------------------------------- CSV


def _rows(text: str) -> list[list[str]]:
    """The CSV rows of ``ncu``'s output, its own messages (``==PROF==``, ``==WARNING==``)
    and the program's output (lines that are not CSV) left out."""
    kept = [line for line in text.splitlines() if line.startswith('"')]
    return [row for row in csv.reader(io.StringIO("\n".join(kept)))]


def number(text: str) -> float | None:
    """A metric's value: ``"1,234.5"`` → 1234.5; ``"-"``, ``"n/a"``, ``""`` → ``None``."""
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class RawKernel:
    """One profiled launch of ``--page raw``: its metrics by name, with their units."""

    name: str  #: the kernel's (demangled) name
    values: Mapping[str, str]  #: every column, as printed
    units: Mapping[str, str]

    def metric(self, name: str) -> float | None:
        return number(self.values.get(name, ""))

    def matching(self, pattern: str) -> dict[str, float]:
        """Every numeric metric whose name matches the regular expression ``pattern``."""
        rx = re.compile(pattern)
        found = {k: number(v) for k, v in self.values.items() if rx.search(k)}
        return {k: v for k, v in found.items() if v is not None}


def parse_raw(text: str) -> list[RawKernel]:
    """The launches in ``ncu --page raw --csv``'s output."""
    rows = _rows(text)
    header = next((i for i, row in enumerate(rows) if row and row[0] == "ID"), None)
    if header is None:
        return []
    names = rows[header]
    body = rows[header + 1:]
    units: dict[str, str] = {}
    if body and not body[0][0].strip():  # the units row: no ID
        units = dict(zip(names, body[0]))
        body = body[1:]
    kernels = []
    for row in body:
        values = dict(zip(names, row))
        kernels.append(RawKernel(values.get("Kernel Name", ""), values, units))
    return kernels


# Stall reasons: the raw metrics' names, the source page's short names, and what each means
# (Nsight Compute's Profiling Guide, "Warp Stall Reasons").
STALLS: dict[str, str] = {
    "long_scoreboard": "waiting for a load's data from global or local memory",
    "short_scoreboard": "waiting for shared memory or a special-function result (MIO: shared loads, sqrt, exp, "
                        "shuffles)",
    "wait": "waiting on a fixed-latency dependency (back-to-back dependent arithmetic)",
    "math_pipe_throttle": "a math pipe is busy: more arithmetic of one kind than that pipe executes",
    "mio_throttle": "the MIO queue is full (shared memory, special functions, shuffles)",
    "lg_throttle": "the local/global memory queue is full (many memory instructions)",
    "tex_throttle": "the texture unit's queue is full",
    "barrier": "waiting at cuda.syncthreads() for the block's other warps",
    "membar": "waiting at a memory fence",
    "branch_resolving": "waiting for a branch target",
    "no_instructions": "waiting for instructions (an instruction-cache miss, or after a branch)",
    "imc_miss": "waiting for the constant cache (kernel parameters, constants)",
    "drain": "waiting for memory stores to drain at exit",
    "dispatch_stall": "the dispatcher could not issue",
    "sleeping": "sleeping (nanosleep, yield)",
    "gmma": "waiting for a warpgroup matrix multiply (wgmma) to finish",
    "misc": "other",
    "not_selected": "ready, but another warp issued (there are warps to spare)",
    "selected": "issuing an instruction",
}

_SHORT = {
    "dispatch": "dispatch_stall", "imc": "imc_miss", "lg": "lg_throttle", "long_sb": "long_scoreboard",
    "math": "math_pipe_throttle", "mio": "mio_throttle", "no_inst": "no_instructions", "short_sb": "short_scoreboard",
    "sleep": "sleeping", "tex": "tex_throttle", "branch": "branch_resolving", "no_instruction": "no_instructions",
}


def stall_name(name: str) -> str:
    """The canonical name of a stall reason (``long_sb`` → ``long_scoreboard``)."""
    return _SHORT.get(name, name)


@dataclasses.dataclass(frozen=True)
class Stall:
    """One stall reason's share of a kernel's sampled warp states."""

    name: str  #: canonical (:data:`STALLS`)
    share: float  #: of all samples (issuing ones included), 0..1
    samples: float

    @property
    def meaning(self) -> str:
        return STALLS.get(self.name, self.name.replace("_", " "))


@dataclasses.dataclass(frozen=True)
class LineCounters:
    """The samples of one source line (summed over the functions inlined there)."""

    file: str
    line: int
    samples: float  #: all samples of the line's instructions
    stalled: float  #: samples of warps not issuing
    reasons: Mapping[str, float]  #: samples per stall reason (canonical names), all samples

    def top_reason(self) -> str | None:
        stalls = {k: v for k, v in self.reasons.items() if k not in ("selected",) and v > 0}
        return max(stalls, key=stalls.get) if stalls else None


_SAMPLES_ALL = re.compile(r"sampl", re.IGNORECASE)
_NOT_ISSUED = re.compile(r"not[- ]?issued", re.IGNORECASE)
_STALL_COLUMN = re.compile(r"^stall_(\w+?)(\s*\(not[- ]?issued\))?$", re.IGNORECASE)
_LINE_COLUMN = re.compile(r"^#?\s*line(\s*no\.?)?$", re.IGNORECASE)


def parse_source(text: str) -> list[LineCounters]:
    """The source lines of ``ncu --page source --print-source cuda,sass --csv``'s
    output, one per (file, line), summed where several functions inlined there."""
    found: dict[tuple[str, int], list] = {}
    file = ""
    columns: dict[str, int] = {}
    stall_columns: dict[str, int] = {}
    line_column = None
    for row in _rows(text):
        if not row:
            continue
        head = row[0].strip()
        if head == "File Path" and len(row) > 1:
            file = row[1]
            continue
        if head in ("Function Name", "Kernel Name"):
            continue
        if _LINE_COLUMN.match(head):  # a header row
            line_column = 0
            columns = {}
            stall_columns = {}
            for i, name in enumerate(row):
                m = _STALL_COLUMN.match(name.strip())
                if m and not m.group(2):
                    stall_columns[stall_name(m.group(1).lower())] = i
                elif _SAMPLES_ALL.search(name) and not _STALL_COLUMN.match(name.strip()):
                    columns["stalled" if _NOT_ISSUED.search(name) else "samples"] = i
            continue
        if line_column is None or not head.isdigit():
            continue  # a SASS row (no line number), or rows before any header
        values = [number(row[i]) if i < len(row) else None for i in range(len(row))]
        samples = values[columns["samples"]] if "samples" in columns else None
        stalled = values[columns["stalled"]] if "stalled" in columns else None
        entry = found.setdefault((file, int(head)), [0.0, 0.0, {}])
        entry[0] += samples or 0.0
        entry[1] += stalled or 0.0
        for name, i in stall_columns.items():
            entry[2][name] = entry[2].get(name, 0.0) + (values[i] or 0.0 if i < len(values) else 0.0)
    return [LineCounters(f, line, s, n, r) for (f, line), (s, n, r) in found.items()]


# ----------------------------------------------------------------------------- figures


@dataclasses.dataclass(frozen=True)
class Figures:
    """What the Profile tab shows of one launch (percentages as shares, 0..1)."""

    kernel: str
    device: str
    duration: float | None  #: seconds
    compute_sol: float | None  #: SM throughput, share of its peak
    memory_sol: float | None  #: memory throughput (DRAM, L2, L1), share of peak
    dram_sol: float | None
    achieved_occupancy: float | None
    theoretical_occupancy: float | None
    tensor_pipe: float | None  #: the tensor pipes' busiest share (None: no such metric)
    stalls: tuple[Stall, ...]  #: most first, issuing ("selected") left out
    issuing: float | None  #: the share of samples that issued
    stall_source: str  #: "sampled warp states" or "cycles per issued instruction"


_TIME_UNITS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3,
               "s": 1.0}


def _share(kernel: RawKernel, name: str) -> float | None:
    value = kernel.metric(name)
    return None if value is None else value / 100.0


def figures(kernel: RawKernel) -> Figures:
    """The Profile tab's figures of one launch of ``--page raw``."""
    duration = kernel.metric("gpu__time_duration.sum")
    if duration is not None:
        duration *= _TIME_UNITS.get(kernel.units.get("gpu__time_duration.sum", "nsecond").strip(), 1e-9)
    tensor = kernel.matching(r"^sm__(pipe|inst_executed_pipe)_tensor\w*\.avg\.pct_of_peak_sustained_(active|elapsed)$")
    sampled = {m.group(1): v for k, v in kernel.matching(r"^smsp__pcsamp_warps_issue_stalled_\w+$").items()
               if (m := re.match(r"^smsp__pcsamp_warps_issue_stalled_(\w+)$", k)) and not k.endswith("_not_issued")}
    source = "sampled warp states"
    if not sum(sampled.values()):
        source = "cycles per issued instruction"
        per_issue = kernel.matching(r"^smsp__average_warps?_(?:latency_)?issue_stalled_")
        sampled = {m.group(1): v for k, v in per_issue.items()
                   if (m := re.match(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)(?:_per_issue_active)?"
                                     r"\.ratio$", k))}
    total = sum(sampled.values())
    stalls = sorted((Stall(stall_name(k), v / total, v) for k, v in sampled.items() if total and v > 0
                     and stall_name(k) != "selected"), key=lambda s: -s.samples)
    issuing = sampled.get("selected", 0.0) / total if total else None
    return Figures(
        kernel=kernel.name,
        device=kernel.values.get("device__attribute_display_name", "") or kernel.values.get("Device", ""),
        duration=duration,
        compute_sol=_share(kernel, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        memory_sol=_share(kernel, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        dram_sol=_share(kernel, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
        achieved_occupancy=_share(kernel, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        theoretical_occupancy=_share(kernel, "sm__maximum_warps_per_active_cycle_pct"),
        tensor_pipe=max(tensor.values()) / 100.0 if tensor else None,
        stalls=tuple(stalls),
        issuing=issuing,
        stall_source=source,
    )

