"""The three workloads that motivated pnex_magic, as pnex ops, with their references and timings.

    python benchmarks/workloads.py            # full size, on a machine with an NVIDIA GPU
    python benchmarks/workloads.py --smoke    # tiny sizes, anywhere (CPU: the CUDA simulator)

* **diffusion**: the Numba documentation's 2-D diffusion stencil (shared-memory tile
  with a halo, ``cuda.syncthreads()``) on a 2000 x 2000 grid, 10,000 steps, against
  the documentation's own kernel in a raw numba-cuda launch loop and an eager
  PyTorch 5-point Laplacian (``conv2d``), plus ``torch.compile`` of it; and a
  temporal-blocking kernel (several steps per launch in shared memory, its tile shape a
  ``pnex.Tune`` choice), whose time per step may fall below the one-step memory floor.
* **LLTM**: the recurrent cell of PyTorch's C++/CUDA extension tutorial with a fused
  forward kernel and a fused backward kernel wired into autograd
  (:func:`pnex_magic.autograd.attach_backward`), forward + backward against the
  tutorial's eager Python version and ``torch.compile`` of it (default mode and,
  on a GPU, ``mode="reduce-overhead"`` for both sides), at batch 16 / 32 features /
  state 128 and at 4096 / 256 / 1024.
* **k-means**: the assignment step of the ``torch.compile`` NumPy tutorial (20 M
  2-D points: index of the nearest centroid), against eager PyTorch and
  ``torch.compile``, with int64 labels (as ``argmin``) and with int32 labels (4 bytes
  less to write per point; the references cast to int32).
* every variant of a workload runs in each of ``--rounds`` (5) interleaved rounds, so that
  drift on a shared machine hits them all; a time is the minimum of the rounds' medians
  (each round's median is in the JSON), and the LLTM's goal is judged round by round.

The notebooks (``notebooks/02_diffusion.ipynb`` ...) define the same kernels with
``%%pnex`` and time them with the functions here, so notebook and benchmark
measure the same code (``tests/test_notebooks.py`` checks the kernel sources are
identical).  Timings are CUDA-event medians over repeated runs after warm-up; the
memory floor is the time of a ``torch`` copy moving the same number of bytes,
measured in the same run.  The script prints a table and writes JSON (GPU, driver,
versions, date) to ``benchmarks/results/workloads-<date>.json``.
"""

# No `from __future__ import annotations`: kernel annotations such as pnex.In(DTYPE, ...)
# must be evaluated where they are written (DTYPE is a local of lltm_ops).
import argparse
import dataclasses
import datetime as _dt
import json
import math
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

DEFAULT_ROUNDS = 5


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, to check the script runs (on CPU through the simulator); writes no results")
    parser.add_argument("--only", nargs="+", choices=["diffusion", "lltm", "kmeans"],
                        default=["diffusion", "lltm", "kmeans"], help="workloads to run")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved rounds of every variant; a time is the minimum of the rounds' medians "
                             f"(default {DEFAULT_ROUNDS}; 2 with --smoke)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the JSON (default: benchmarks/results/workloads-<date>.json; "
                             "with --smoke, nothing is written unless given)")
    return parser


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    build_parser().parse_args()  # prints the help and exits, before the imports below (no torch needed)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from numba import cuda, float32, int32, int64  # noqa: E402

import pnex_magic as pnex
from pnex_magic.autograd import attach_backward
from pnex_magic.timing import Measurement, cuda_event_timer, measure

RESULTS = Path(__file__).resolve().parent / "results"

__all__ = [
    # diffusion
    "TX", "TY", "ROWS_PER_THREAD", "TILE_ROWS", "HALO_SHAPE", "diffusion_step", "initial_field", "laplacian", "torch_diffusion_step",
    "eager_step_into", "run_diffusion", "run_diffusion_eager", "reference_diffusion",
    "docs_diffusion_kernel", "raw_numba_diffusion", "bench_diffusion",
    "MAX_STEPS_PER_LAUNCH", "diffusion_blocked", "run_diffusion_blocked", "eager_steps_into", "blocked_tile",
    "blocked_variant", "BLOCKED_PER_LAUNCH", "RAW", "judge_diffusion", "DIFFUSION_FLOOR_GOAL",
    # LLTM
    "LLTM", "LLTMPnex", "LLTMOps", "lltm_ops", "lltm_forward", "lltm_backward",
    "lltm_cell_reference", "lltm_cell_backward_reference", "train_lltm", "bench_lltm",
    # k-means
    "POINTS_PER_THREAD", "kmeans_ops", "kmeans_tuned_ops", "kmeans_assign", "kmeans_reference", "kmeans_data", "check_labels", "bench_kmeans",
    # shared
    "Row", "Workload", "time_per_call", "copy_time", "dram_copy_bandwidth", "environment",
    "format_table", "markdown_table", "same_kernel", "run", "main",
]


# =============================================================================================
# Timing
# =============================================================================================


def _wall_timer(fn: Callable[[], Any], loops: int) -> float:
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    return time.perf_counter() - start


def _timer_for(device: torch.device | str) -> Callable:
    device = torch.device(device)
    if device.type == "cuda":
        return cuda_event_timer(device)
    return _wall_timer


def time_per_call(
    fn: Callable[[], Any], device: torch.device | str, *, repeat: int = 10, loops: int = 20, warmup: int = 3
) -> Measurement:
    """Median-friendly timings of ``fn()``: ``warmup`` calls, then ``repeat`` runs of
    ``loops`` calls each, timed with CUDA events on a GPU (wall clock on CPU, where
    the numbers are the simulator's and mean nothing for the GPU)."""
    return measure(fn, _timer_for(device), repeat=repeat, loops=loops, warmup=warmup)


def host_seconds(fn: Callable[[], Any], device: torch.device | str, loops: int = 10) -> float:
    """Wall-clock seconds the host takes to issue one call of ``fn()`` (``loops`` calls
    back to back, the GPU idle before them, their end not waited for): where it is close
    to the time per call, the host sets the pace, not the GPU.  Few enough calls that
    CUDA's launch queue does not fill (a full queue would make the host wait for the GPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    issued = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return issued / loops


def copy_time(nbytes_moved: int, device: torch.device | str, *, repeat: int = 10, loops: int = 20) -> float:
    """Seconds a ``torch`` copy takes to move ``nbytes_moved`` bytes (read half, write
    half): the memory floor of a kernel that reads and writes that much once."""
    n = max(1, nbytes_moved // 2)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return time_per_call(lambda: dst.copy_(src), device, repeat=repeat, loops=loops).median


def dram_copy_bandwidth(device: torch.device | str, nbytes: int = 1 << 30) -> float:
    """Bytes per second (read + written) of a copy far larger than the L2 cache."""
    seconds = copy_time(2 * nbytes, device, repeat=5, loops=5)
    return 2 * nbytes / seconds


# =============================================================================================
# Results
# =============================================================================================


@dataclasses.dataclass
class Row:
    """One variant of a workload."""

    variant: str
    seconds: float | None  #: per step / per call, the minimum of the rounds' medians; None when it could not run
    check: str = ""  #: how its result compares with the eager reference
    note: str = ""
    rounds: list[float | None] = dataclasses.field(default_factory=list)  #: each round's median (None: failed)
    host_seconds: float | None = None  #: host time to issue one call (:func:`host_seconds`; measured on a GPU)

    @property
    def us(self) -> float | None:
        return None if self.seconds is None else self.seconds * 1e6


EAGER = "eager PyTorch"
COMPILED = "torch.compile"
COMPILED_GRAPHS = "torch.compile(mode='reduce-overhead')"
FLOOR = "memory floor (torch copy, same bytes)"


@dataclasses.dataclass
class Workload:
    """Every variant of one workload at one size, and the goal it is held to."""

    name: str
    size: str
    unit: str  #: what one time is: "per step", "per call", "forward+backward"
    rows: list[Row]
    headline: str = ""  #: the pnex variant the goal is about
    goal: str = ""
    goal_met: bool | None = None
    device: str = ""
    #: why the goal was missed, from the measured times (what failed, by how much, and the cause where the
    #: figures show it); "" where it was met or not judged
    goal_why: str = ""

    def seconds(self, variant: str) -> float | None:
        for row in self.rows:
            if row.variant == variant:
                return row.seconds
        return None

    def best(self, prefix: str) -> tuple[str, float | None]:
        """The fastest variant whose name starts with ``prefix``, and its time."""
        timed = [r for r in self.rows if r.variant.startswith(prefix) and r.seconds is not None]
        if not timed:
            return "", None
        fastest = min(timed, key=lambda r: r.seconds)
        return fastest.variant, fastest.seconds

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        for row in data["rows"]:
            row["us"] = None if row["seconds"] is None else row["seconds"] * 1e6
        return data


def _fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    us = seconds * 1e6
    if us >= 1e5:
        return f"{us / 1e3:,.1f} ms"
    return f"{us:,.1f} µs" if us < 1e3 else f"{us / 1e3:,.3f} ms"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return ""
    return f"{a / b:.2f}x"


#: The time column: each variant's time is the median of its runs within a round, and the table
#: gives its fastest round's (see :func:`_run_rounds`).
TIME_COLUMN = "time (fastest round's median)"
#: The ratio columns: all of them speeds, another time over this one, so each reads the same way:
#: above 1.00 this variant is faster.
SPEED_COLUMNS = ("× eager's speed", "× torch.compile's speed", "× the memory floor's speed")


def _table_rows(workloads: list[Workload]) -> tuple[list[str], list[list[str]]]:
    header = ["workload", "variant", TIME_COLUMN, *SPEED_COLUMNS, "goal", "check"]
    rows = []
    for w in workloads:
        eager = w.seconds(EAGER)
        compiled = w.seconds(COMPILED)
        floor = w.seconds(FLOOR)
        for r in w.rows:
            goal = ""
            if r.variant == w.headline and w.goal:
                verdict = {True: "MET", False: "NOT MET", None: "not judged"}[w.goal_met]
                goal = f"{verdict}: {w.goal}" + (f"; {w.goal_why}" if w.goal_why else "")
            rows.append([
                f"{w.name} {w.size} ({w.unit})",
                r.variant + (f" [{r.note}]" if r.note else ""),
                _fmt_us(r.seconds),
                "" if r.variant in (EAGER, FLOOR) else _ratio(eager, r.seconds),
                "" if r.variant in (COMPILED, FLOOR) else _ratio(compiled, r.seconds),
                "" if r.variant == FLOOR else _ratio(floor, r.seconds),
                goal,
                r.check,
            ])
    return header, rows


def goal_line(w: Workload) -> str:
    """The goal of ``w`` and whether this run met it, with why not (``w.goal_why``)."""
    if not w.goal:
        return f"{w.name} {w.size}: no goal judged (goals are judged on a GPU at full size)"
    verdict = {True: "MET", False: "NOT MET", None: "not judged"}[w.goal_met]
    return f"{w.name} {w.size}: goal {verdict}: {w.goal}" + (f"; {w.goal_why}" if w.goal_why else "")


#: Two times within this factor of each other are a tie: the rounds' spread is of this order.
TIE = 1.03


def versus(w: Workload, a: str, b: str) -> str:
    """``a`` against ``b`` in ``w``, in words computed from their times: which is faster
    and by how much, or a tie (within :data:`TIE`)."""
    ta, tb = w.seconds(a), w.seconds(b)
    if ta is None or tb is None:
        return f"{a} against {b}: not both timed"
    if max(ta, tb) <= TIE * min(ta, tb):
        how = "a tie"
    else:
        how = f"{tb / ta:.2f}x its speed: {'faster' if ta < tb else 'slower'}"
    return f"{a}: {_fmt_us(ta)} against {b}: {_fmt_us(tb)}; {how}"


def host_share(r: Row) -> str:
    """What share of ``r``'s time per call the host took to issue it, and what sets the pace."""
    if r.host_seconds is None or not r.seconds:
        return f"{r.variant}: host time not measured"
    share = r.host_seconds / r.seconds
    pace = "the host sets the pace (host-bound)" if share >= 0.8 else "the GPU sets the pace"
    return f"{r.variant}: the host takes {_fmt_us(r.host_seconds)} to issue a call of {_fmt_us(r.seconds)}: {pace}"


def format_table(workloads: list[Workload]) -> str:
    """The results as a plain-text table.  Every ratio is a speed, another variant's
    time over this one's: above 1.00, this variant is the faster ("× the memory floor's
    speed" 1.00: at the floor)."""
    header, rows = _table_rows(workloads)
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def markdown_table(workloads: list[Workload]) -> str:
    """The same table in Markdown (for notebooks: ``display(Markdown(...))``)."""
    header, rows = _table_rows(workloads)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _versions() -> dict:
    from importlib import metadata

    v = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    for dist in ("numba-cuda", "numba", "pnex_magic", "numpy", "triton"):
        try:
            v[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            v[dist] = None
    return v


def environment() -> dict:
    """Where this runs: GPU name, capability and driver (if any), and versions."""
    info: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if torch.cuda.is_available():
        gpu = {"name": torch.cuda.get_device_name(), "capability": "%d.%d" % torch.cuda.get_device_capability()}
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30,
            )
            gpu["driver"] = out.stdout.strip().splitlines()[0]
        except Exception:
            gpu["driver"] = None
        info["gpu"] = gpu
        info["device"] = f"{gpu['name']} (driver {gpu['driver']}, CUDA {torch.version.cuda})"
    else:
        info["gpu"] = None
        info["device"] = "CPU only: pnex ops run in numba-cuda's CUDA simulator (no GPU timings)"
    info["versions"] = _versions()
    return info


def same_kernel(op: Any, reference: Any) -> bool:
    """True when two pnex ops were made from the same kernel source (the function
    definition without its decorators, compared as a syntax tree, so formatting and
    comments do not matter).  Notebooks use it to show that their ``%%pnex`` cell is
    the kernel this module benchmarks."""
    import ast
    import inspect
    import textwrap

    def tree(fn_or_op: Any) -> str:
        definition = getattr(fn_or_op, "definition", None)
        fn = definition.fn if definition is not None else fn_or_op
        source = textwrap.dedent(inspect.getsource(fn))
        node = ast.parse(source).body[0]
        node.decorator_list = []
        node.name = "kernel"
        return ast.dump(node, annotate_fields=False)

    return tree(op) == tree(reference)


def _check_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float) -> tuple[bool, str]:
    """Whether ``actual`` is within ``rtol`` of ``expected``'s largest value everywhere, and
    the largest difference in those words."""
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    scale = float(e.abs().max()) or 1.0
    err = float((a - e).abs().max()) / scale
    return err <= rtol, f"largest difference {err:.1e} of the largest reference value"


_TRACEBACKS = False  # the command line prints the traceback of a failed variant


ROUNDS = DEFAULT_ROUNDS  #: rounds of every variant, interleaved (``--rounds``)


def _run_rounds(rows: list[Row], variants: list[tuple[str, Callable[[], Row | float]]], rounds: int | None = None) -> None:
    """Run every variant once per round, the rounds interleaved (round r starts at the
    r-th variant), so that drift on a shared machine hits every variant alike.  Each run
    is a median over its own repeats; a row's time is the minimum of its rounds' medians
    (all of them in ``Row.rounds``), its check the last round's.  A variant that fails is
    not run again and becomes a row saying so (the others still run)."""
    rounds = ROUNDS if rounds is None else rounds
    samples: dict[str, list[float | None]] = {name: [] for name, _ in variants}
    last: dict[str, Row] = {}
    failed: dict[str, str] = {}
    for r in range(rounds):
        start = r % len(variants)
        for name, fn in variants[start:] + variants[:start]:
            if name in failed:
                samples[name].append(None)
                continue
            try:
                result = fn()
            except Exception as exc:  # report, do not hide, a variant that failed
                if _TRACEBACKS:
                    traceback.print_exc()
                failed[name] = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
                samples[name].append(None)
                continue
            row = result if isinstance(result, Row) else Row(name, result)
            samples[name].append(row.seconds)
            last[name] = row
    for name, _ in variants:
        row = last.get(name)
        if row is None:
            rows.append(Row(name, None, note=failed.get(name, "FAILED"), rounds=samples[name]))
            continue
        timed = [t for t in samples[name] if t is not None]
        row.seconds = min(timed) if timed else None
        row.rounds = samples[name]
        if name in failed:
            row.note = f"{failed[name]} (after {len(timed)} round(s))"
        rows.append(row)


def _each_round(workload: "Workload", mine: list[str], others: list[str]) -> list[bool | None]:
    """Per round: whether the fastest of the ``mine`` rows beat every one of ``others``
    (None where a row has no time that round)."""
    by_name = {r.variant: r.rounds for r in workload.rows}
    verdicts: list[bool | None] = []
    for i in range(max((len(v) for v in by_name.values()), default=0)):
        def at(name: str) -> float | None:
            times = by_name.get(name) or []
            return times[i] if i < len(times) else None

        ours = [at(n) for n in mine if at(n) is not None]
        theirs = [at(n) for n in others]
        verdicts.append(None if not ours or None in theirs else all(min(ours) < t for t in theirs))
    return verdicts


# =============================================================================================
# Diffusion
# =============================================================================================

# The thread block is 32 x 8 threads; each thread updates 4 points of its column, 8 rows
# apart, so a block updates a 32 x 32 tile.  Several independent loads per thread are
# what it takes to keep the GPU's memory busy.  Shared-memory sizes must be
# compile-time constants, hence the module-level names.
TX, TY = 32, 8  # threads per block (X along a row, so a warp reads 32 consecutive floats)
ROWS_PER_THREAD = 4  # also in n_threads below: (u.size(0) + 3) // 4 threads down a column
TILE_ROWS = TY * ROWS_PER_THREAD
HALO_SHAPE = (TILE_ROWS + 2, TX + 2)  # the tile and a one-point halo around it


@pnex.jit(n_threads=("u.size(1)", "(u.size(0) + 3) // 4"), threads_per_block=(TX, TY))
def diffusion_step(
    u: pnex.In("f32", (None, None)),
    u_new: pnex.InMut("f32", "u"),
    coeff: pnex.Scalar("f32"),
):
    rows, cols = u.shape
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * TX + tx  # this thread's column
    top = cuda.blockIdx.y * TILE_ROWS  # the tile's first row
    zero = float32(0.0)

    # 1. Read this thread's points into registers (0 outside the grid), all loads at once.
    mine = cuda.local.array(ROWS_PER_THREAD, float32)
    for k in range(ROWS_PER_THREAD):
        row = top + ty + k * TY
        mine[k] = u[row, col] if row < rows and col < cols else zero
    # The halo (the rows above and below the tile, the columns left and right of it):
    # one point each for the block's first 2 * (TX + TILE_ROWS) threads.
    h = ty * TX + tx
    if h < 2 * TX:
        hr = 0 if h < TX else TILE_ROWS + 1
        hc = h % TX + 1
    else:
        hr = (h - 2 * TX) % TILE_ROWS + 1
        hc = 0 if h < 2 * TX + TILE_ROWS else TX + 1
    halo_row = top + hr - 1
    halo_col = cuda.blockIdx.x * TX + hc - 1
    has_halo = h < 2 * (TX + TILE_ROWS)
    inside = has_halo and 0 <= halo_row < rows and 0 <= halo_col < cols
    halo = u[halo_row, halo_col] if inside else zero

    # 2. Share them through shared memory, and wait for the whole block.
    tile = cuda.shared.array(shape=HALO_SHAPE, dtype=float32)
    for k in range(ROWS_PER_THREAD):
        tile[ty + k * TY + 1, tx + 1] = mine[k]
    if has_halo:
        tile[hr, hc] = halo
    cuda.syncthreads()

    # 3. Each point moves by coeff times its 5-point Laplacian.
    for k in range(ROWS_PER_THREAD):
        r = ty + k * TY + 1
        row = top + r - 1
        if row < rows and col < cols:
            c = tile[r, tx + 1]
            laplacian = tile[r - 1, tx + 1] + tile[r + 1, tx + 1] + tile[r, tx] + tile[r, tx + 2] - (c + c + c + c)
            u_new[row, col] = c + coeff * laplacian


def initial_field(n: int, seed: int = 3966789) -> torch.Tensor:
    """The Numba documentation's "jagged image": filtered noise, thresholded (float32)."""
    from numpy import fft

    r = np.random.default_rng(seed)
    field = r.random(size=(n, n), dtype=np.float32)
    field = fft.fftshift(fft.fft2(field))
    radius = 1 + np.sqrt((np.arange(n).reshape(-1, 1) - n // 2) ** 2 + (np.arange(n).reshape(1, -1) - n // 2) ** 2)
    field = field * (radius**-1.7)
    field = fft.ifft2(fft.ifftshift(field)) * (radius < 0.45 * n)
    field = field.real * (field.real > np.percentile(field.real, 70))
    return torch.from_numpy(np.ascontiguousarray(field, dtype=np.float32))


_LAPLACIAN = ((0.0, -1.0, 0.0), (-1.0, 4.0, -1.0), (0.0, -1.0, 0.0))


def laplacian(u: torch.Tensor) -> torch.Tensor:
    """The documentation's ``lapl``: 4 u minus its four neighbours (0 outside), by conv2d."""
    weight = torch.tensor(_LAPLACIAN, dtype=u.dtype, device=u.device).view(1, 1, 3, 3)
    return F.conv2d(u[None, None], weight, padding=1)[0, 0]


def torch_diffusion_step(u: torch.Tensor, weight: torch.Tensor, coeff: float) -> torch.Tensor:
    """One eager step on ``u`` of shape (1, 1, n, n): ``u - coeff * lapl``, the 5-point
    Laplacian as a conv2d with zero padding (the same boundary as the kernels)."""
    return u - coeff * F.conv2d(u, weight, padding=1)


def reference_diffusion(u0: torch.Tensor, steps: int, coeff: float = 0.25) -> torch.Tensor:
    """``steps`` steps in float64 by shifted slices (no conv2d, no TF32): the reference
    every variant's field is checked against."""
    u = u0.double()
    for _ in range(steps):
        p = F.pad(u, (1, 1, 1, 1))
        u = u + coeff * (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u)
    return u


def eager_step_into(u: torch.Tensor, u_new: torch.Tensor, coeff: float) -> None:
    """The pnex op's contract in eager PyTorch: write one step from ``u`` into ``u_new``
    (the reference the ``%%pnex`` cell checks the kernel against)."""
    u_new.copy_(u - coeff * laplacian(u))


def eager_steps_into(u: torch.Tensor, u_new: torch.Tensor, coeff: float, steps: int) -> None:
    """The blocked op's contract in eager PyTorch: write ``steps`` steps from ``u`` into
    ``u_new`` (the reference the ``%%pnex`` cell checks :func:`diffusion_blocked` against)."""
    u_new.copy_(run_diffusion_eager(u, steps, coeff))


def laplacian_weight(device: torch.device | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(_LAPLACIAN, dtype=dtype, device=device).view(1, 1, 3, 3)


def run_diffusion(step_op: Any, u0: torch.Tensor, steps: int, coeff: float = 0.25) -> torch.Tensor:
    """``steps`` steps of the pnex op from ``u0`` (unchanged), ping-ponging between two
    buffers: no allocation per step.  Returns the final field."""
    a = u0.clone()
    b = torch.empty_like(a)
    for _ in range(steps // 2):
        step_op(a, b, coeff)
        step_op(b, a, coeff)
    if steps % 2:
        step_op(a, b, coeff)
        return b
    return a


def run_diffusion_eager(u0: torch.Tensor, steps: int, coeff: float = 0.25, step=torch_diffusion_step) -> torch.Tensor:
    weight = laplacian_weight(u0.device, u0.dtype)
    u = u0[None, None].clone()
    for _ in range(steps):
        u = step(u, weight, coeff)
    return u[0, 0]


# Temporal blocking: several steps per launch.  A block loads a tile of the field, halo
# included, into registers, then takes `steps` steps on it, exchanging neighbours through
# shared memory, and writes the tile's interior once.  A one-step kernel reads and writes the
# whole field every step; this one does so once per `steps` steps (plus the halo, read by two
# blocks), so its DRAM traffic per step is about 1/steps of the one-step kernel's.  The price
# is work on the halo: a tile of H x W updates (H - 2 steps) x (W - 2 steps) points.
#
# The halo is `steps` wide: the tile's edge points have neighbours outside the tile, so they
# are not updated (they go stale), and the stale band grows by one point a step.  After
# `steps` steps the points at least `steps` from the edge are exact: those are written.
#
# The block is 32 x 8 threads.  Each thread holds ROWS consecutive rows of COLS columns
# (32 apart, so a warp reads and writes 32 neighbours of a row) in registers; above/below
# neighbours come from its own registers, except at the ends of its column, and left/right
# neighbours from shared memory.  ROWS and COLS (the tile's shape, 8 ROWS x 32 COLS) are
# pnex.Tune parameters: the autotuner times every choice and keeps the fastest.  The results
# do not depend on them (every point is computed the same way), so every choice is exact.
MAX_STEPS_PER_LAUNCH = 15  # the smallest tile (32 x 32) must keep an interior: 32 - 2 * steps > 0


@pnex.jit(
    n_threads=("(u.size(1) + 32 * COLS - 2 * steps - 1) // (32 * COLS - 2 * steps) * 32",
               "(u.size(0) + 8 * ROWS - 2 * steps - 1) // (8 * ROWS - 2 * steps) * 8"),
    threads_per_block=(32, 8),  # pinned: the tile is sized for it
    shared_bytes="2 * (8 * ROWS + 2) * (32 * COLS) * 4",  # two tiles and a row above and below each
    autotune_key=("u.size(0)", "u.size(1)", "steps"),
)
def diffusion_blocked(
    u: pnex.In("f32", (None, None)),
    u_new: pnex.InMut("f32", "u"),
    coeff: pnex.Scalar("f32"),
    steps: pnex.Scalar("i32"),
    ROWS: pnex.Tune(4, 8),
    COLS: pnex.Tune(1, 2, 4),
):
    rows, cols = u.shape
    tx = cuda.threadIdx.x & 31  # the block is 32 x 8; the masks tell the compiler these are >= 0,
    ty = cuda.threadIdx.y & 7  # so that no shared-memory index below is tested for wrap-around
    H = 8 * ROWS  # the tile, halo included
    W = 32 * COLS
    r0 = ty * ROWS  # this thread's first row in the tile
    top = cuda.blockIdx.y * (H - 2 * steps) - steps  # the tile's first row and column in the field
    left = cuda.blockIdx.x * (W - 2 * steps) - steps

    # 1. Load the tile into registers (0 outside the field), and note which points to update:
    #    inside the field (outside it the field is 0 at every step) and not on the tile's edge.
    v = cuda.local.array((ROWS, COLS), float32)
    row_live = cuda.local.array(ROWS, int32)
    col_live = cuda.local.array(COLS, int32)
    for i in range(ROWS):
        row = top + r0 + i
        row_live[i] = 0 < r0 + i < H - 1 and 0 <= row < rows
        for j in range(COLS):
            col = left + tx + 32 * j
            v[i, j] = u[row, col] if 0 <= row < rows and 0 <= col < cols else float32(0.0)
    for j in range(COLS):
        col = left + tx + 32 * j
        col_live[j] = 0 < tx + 32 * j < W - 1 and 0 <= col < cols

    # 2. The steps.  Shared memory holds two tiles (even and odd steps), each with a spare row
    #    above and below; tile row r is shared row r + 1.  One barrier a step: a thread writes
    #    tile s % 2 only after every thread has read it at step s - 2.
    tile = cuda.shared.array(0, float32)
    for s in range(steps):
        at = (s & 1) * ((H + 2) * W) + r0 * W + tx  # the shared row above this thread's first
        for i in range(ROWS):
            for j in range(COLS):
                tile[at + (i + 1) * W + 32 * j] = v[i, j]
        cuda.syncthreads()
        for j in range(COLS):
            above = tile[at + 32 * j]
            for i in range(ROWS):
                here = v[i, j]
                k = at + (i + 1) * W + 32 * j
                below = v[i + 1, j] if i < ROWS - 1 else tile[k + W]
                new = here + coeff * (above + below + tile[k - 1] + tile[k + 1] - float32(4.0) * here)
                v[i, j] = new if row_live[i] and col_live[j] else here
                above = here

    # 3. Write the points at least `steps` from the tile's edge: those are exact.
    for i in range(ROWS):
        row = top + r0 + i
        for j in range(COLS):
            col = left + tx + 32 * j
            if steps <= r0 + i < H - steps and steps <= tx + 32 * j < W - steps and row < rows and col < cols:
                u_new[row, col] = v[i, j]


def run_diffusion_blocked(
    op: Any, u0: torch.Tensor, steps: int, coeff: float = 0.25, per_launch: int = 4
) -> torch.Tensor:
    """``steps`` steps of :func:`diffusion_blocked` from ``u0`` (unchanged), ``per_launch``
    steps per launch and the remainder in one last launch, ping-ponging between two
    buffers.  Returns the final field."""
    if not 1 <= per_launch <= MAX_STEPS_PER_LAUNCH:
        raise ValueError(f"per_launch must be from 1 to {MAX_STEPS_PER_LAUNCH} (the halo is per_launch points wide "
                         f"and the smallest tile 32 x 32), got {per_launch}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    a = u0.clone()
    b = torch.empty_like(a)
    done = 0
    while done < steps:
        n = min(per_launch, steps - done)
        op(a, b, coeff, n)
        a, b = b, a
        done += n
    return a


# The documentation's kernel, as written there (8 x 8 blocks, x along the first axis,
# updating the field in place and writing the Laplacian).  Compiled on first use.
DOCS_TPB = 8
_DOCS_SHASIZE = DOCS_TPB + 2
_DOCS_COEFF = 0.25
_docs_kernel_cache: list = []


def docs_diffusion_kernel():
    if not _docs_kernel_cache:

        @cuda.jit
        def diffusion(field, lapl):
            x, y = cuda.grid(2)
            # Shared array has two extra rows and columns to store edge values
            sharedarray = cuda.shared.array(shape=(_DOCS_SHASIZE, _DOCS_SHASIZE), dtype=float32)
            tx = cuda.threadIdx.x
            ty = cuda.threadIdx.y
            # Don't try to load edge values from outside the array
            if tx == 0 and x > 0:
                sharedarray[0, ty + 1] = field[x - 1, y]
            if ty == 0 and y > 0:
                sharedarray[tx + 1, 0] = field[x, y - 1]
            if tx == DOCS_TPB - 1 and x < field.shape[0] - 1:
                sharedarray[-1, ty + 1] = field[x + 1, y]
            if ty == DOCS_TPB - 1 and y < field.shape[1] - 1:
                sharedarray[tx + 1, -1] = field[x, y + 1]
            # Load all inner values into tx + 1, ty + 1.
            sharedarray[tx + 1, ty + 1] = field[x, y]
            val = 4 * sharedarray[tx + 1, ty + 1]
            # Synchronize after loading
            cuda.syncthreads()
            # Check that we are not at the very edges of the array.
            if x > 0:
                val -= sharedarray[tx, ty + 1]
            if y > 0:
                val -= sharedarray[tx + 1, ty]
            if x < field.shape[0] - 1:
                val -= sharedarray[tx + 2, ty + 1]
            if y < field.shape[1] - 1:
                val -= sharedarray[tx + 1, ty + 2]
            # Check that we are within boundaries when saving.
            if x < field.shape[0] and y < field.shape[1]:
                lapl[x, y] = val
                field[x, y] -= val * _DOCS_COEFF

        _docs_kernel_cache.append(diffusion)
    return _docs_kernel_cache[0]


def _numba_event_timer(fn: Callable[[], Any], loops: int) -> float:
    start = cuda.event()  # timing=True is the default (and the simulator takes no argument)
    end = cuda.event()
    start.record()
    for _ in range(loops):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3  # milliseconds


def raw_numba_diffusion(u0: torch.Tensor, chunk: int, repeat: int) -> tuple[float, torch.Tensor]:
    """The documentation's launch loop: ``diffusion[blockspergrid, threadsperblock](field_gpu,
    lapl_gpu)`` on numba device arrays.  Returns (seconds per step, final field) after
    ``(repeat + 1) * chunk`` steps (one chunk of warm-up)."""
    kernel = docs_diffusion_kernel()
    field = u0.cpu().numpy().copy()
    n0, n1 = field.shape
    if n0 % DOCS_TPB or n1 % DOCS_TPB:
        raise ValueError(f"the documentation's kernel needs sizes that are multiples of {DOCS_TPB}, got {field.shape}")
    threadsperblock = (DOCS_TPB, DOCS_TPB)
    blockspergrid = (math.ceil(n0 / DOCS_TPB), math.ceil(n1 / DOCS_TPB))
    field_gpu = cuda.to_device(field)
    lapl_gpu = cuda.device_array_like(field)

    def run_chunk():
        for _ in range(chunk):
            kernel[blockspergrid, threadsperblock](field_gpu, lapl_gpu)

    m = measure(run_chunk, _numba_event_timer, repeat=repeat, loops=1, warmup=1)
    return m.median / chunk, torch.from_numpy(field_gpu.copy_to_host())


def _graph_loop(advance: Callable[[torch.Tensor, torch.Tensor, int], None], u0: torch.Tensor, chunk: int,
                repeat: int, graph_steps: int):
    """``advance(a, b, graph_steps)`` (steps from ``a``, the result back in ``a``, ``b`` a
    scratch buffer) captured in a CUDA graph, replayed ``chunk // graph_steps`` times per
    timed run.  Returns (seconds per step, final field)."""
    a = u0.clone()
    b = torch.empty_like(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (load the module, autotune) outside the capture
        advance(a, b, graph_steps)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        advance(a, b, graph_steps)
    a.copy_(u0)
    replays = chunk // graph_steps

    def run_chunk():
        for _ in range(replays):
            graph.replay()

    m = measure(run_chunk, cuda_event_timer(u0.device), repeat=repeat, loops=1, warmup=1)
    return m.median / chunk, a


def _blocked_graph_steps(chunk: int, per_launch: int, most: int = 100) -> int:
    """Steps per CUDA graph for the blocked kernel: an even number of launches (the result
    back in the first buffer), dividing ``chunk``, at most ``most``; 0 where none does."""
    unit = 2 * per_launch
    return max((n for n in range(unit, most + 1, unit) if chunk % n == 0), default=0)


def blocked_tile(op: Any, u: torch.Tensor, steps: int, coeff: float = 0.25) -> str:
    """The tile the autotuner chose for ``op`` (:func:`diffusion_blocked`) on ``u`` at
    ``steps`` steps a launch, in words (after a call with that key)."""
    from pnex_magic.launch import autotune

    result = autotune.result_for(op.definition, (u, u, coeff, steps))
    if result is None:
        return "tile not chosen yet"
    tune = dict(result.tune)
    shape = f"{8 * tune['ROWS']} x {32 * tune['COLS']}"
    how = "autotuned" if result.source.startswith(("benchmarked", "disk cache")) else result.source.split(":")[0]
    return f"tile {shape} ({how})"


RAW = "raw numba-cuda launch loop (documentation's kernel)"
BLOCKED_PER_LAUNCH = (1, 4, 8)  #: steps per launch of the blocked kernel's rows in bench_diffusion


def blocked_variant(per_launch: int, graph_steps: int = 0) -> str:
    """The name of the blocked kernel's row for ``per_launch`` steps a launch (a CUDA graph
    of ``graph_steps`` steps, if given)."""
    name = f"pnex blocked kernel, {per_launch} step{'s' if per_launch > 1 else ''} per launch"
    return name + (f", CUDA graph of {graph_steps} steps" if graph_steps else "")


def bench_diffusion(
    n: int = 2000,
    steps: int = 10_000,
    *,
    device: torch.device | str | None = None,
    step_op: Any = None,
    coeff: float = 0.25,
    repeat: int = 5,
    compile_variants: bool = True,
    rounds: int | None = None,
    blocked_op: Any = None,
    per_launch: tuple[int, ...] = BLOCKED_PER_LAUNCH,
) -> Workload:
    """Time ``steps`` diffusion steps of every variant on an ``n`` x ``n`` grid (as
    ``repeat`` timed runs of ``steps // repeat`` steps after one such run of warm-up,
    in each of ``rounds`` interleaved rounds) and check each final field against float64.
    ``step_op`` is the one-step op (:func:`diffusion_step`), ``blocked_op`` the
    temporal-blocking one (:func:`diffusion_blocked`), run at each of ``per_launch``
    steps per launch."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    step_op = step_op or diffusion_step
    blocked_op = blocked_op or diffusion_blocked
    on_gpu = device.type == "cuda"
    chunk = max(2, steps // repeat // 2 * 2)  # even: the pnex loops ping-pong
    total = (repeat + 1) * chunk
    u0 = initial_field(n).to(device)
    timer = _timer_for(device)
    rows: list[Row] = []
    results: dict[str, torch.Tensor] = {}

    def torch_loop(step, variant):
        weight = laplacian_weight(device)
        state = [u0[None, None].clone()]

        def run_chunk():
            u = state[0]
            for _ in range(chunk):
                u = step(u, weight, coeff)
            state[0] = u

        m = measure(run_chunk, timer, repeat=repeat, loops=1, warmup=1)
        results[variant] = state[0][0, 0]
        return m.median / chunk

    variants: list[tuple[str, Callable[[], Row | float]]] = []
    variants.append((EAGER, lambda: torch_loop(torch_diffusion_step, EAGER)))
    if compile_variants:
        compiled = torch.compile(torch_diffusion_step, fullgraph=True)
        variants.append((COMPILED, lambda: torch_loop(compiled, COMPILED)))
    if on_gpu:

        def raw():
            seconds, field = raw_numba_diffusion(u0, chunk, repeat)
            results["raw"] = field
            return Row(RAW, seconds)

        variants.append((RAW, raw))

    def pnex_loop():
        a = u0.clone()
        b = torch.empty_like(a)

        def run_chunk():
            for _ in range(chunk // 2):
                step_op(a, b, coeff)
                step_op(b, a, coeff)

        m = measure(run_chunk, timer, repeat=repeat, loops=1, warmup=1)
        results["pnex"] = a
        return Row("pnex op, Python loop", m.median / chunk)

    variants.append(("pnex op, Python loop", pnex_loop))
    graph_variant = ""
    if on_gpu:
        graph_steps = 100 if chunk % 100 == 0 else chunk

        def pairs(a, b, count):
            for _ in range(count // 2):
                step_op(a, b, coeff)
                step_op(b, a, coeff)

        def graph():
            seconds, field = _graph_loop(pairs, u0, chunk, repeat, graph_steps)
            results["graph"] = field
            return Row(f"pnex op, CUDA graph of {graph_steps} steps", seconds)

        graph_variant = f"pnex op, CUDA graph of {graph_steps} steps"
        variants.append((graph_variant, graph))

    def advance_blocked(t):
        """``count`` steps from ``a`` into ``a`` (``count`` a multiple of 2 t), t a launch."""
        def advance(a, b, count):
            for _ in range(count // (2 * t)):
                blocked_op(a, b, coeff, t)
                blocked_op(b, a, coeff, t)
        return advance

    def blocked_loop(t):
        name = blocked_variant(t)

        def run():
            state = [u0.clone(), torch.empty_like(u0)]

            def run_chunk():
                a, b = state
                done = 0
                while done < chunk:
                    k = min(t, chunk - done)
                    blocked_op(a, b, coeff, k)
                    a, b = b, a
                    done += k
                state[:] = [a, b]

            m = measure(run_chunk, timer, repeat=repeat, loops=1, warmup=1)
            results[name] = state[0]
            tile = blocked_tile(blocked_op, u0, t, coeff)
            return Row(name, m.median / chunk, note=f"{tile}; field read + written once per launch")

        return name, run

    def blocked_graph(t, g):
        name = blocked_variant(t, g)

        def run():
            seconds, field = _graph_loop(advance_blocked(t), u0, chunk, repeat, g)
            results[name] = field
            return Row(name, seconds, note=blocked_tile(blocked_op, u0, t, coeff))

        return name, run

    for t in per_launch:
        variants.append(blocked_loop(t))
        g = _blocked_graph_steps(chunk, t)
        if on_gpu and t > 1 and g:
            variants.append(blocked_graph(t, g))
    if on_gpu:
        one_step = "one step: read u, write u_new"
        variants.append((FLOOR, lambda: Row(FLOOR, copy_time(2 * 4 * n * n, device), note=one_step)))
    _run_rounds(rows, variants, rounds)

    # Correctness: every variant ran `total` steps from u0; compare with float64.
    reference = reference_diffusion(u0, total, coeff)
    keys = {EAGER: EAGER, COMPILED: COMPILED, RAW: "raw",
            "pnex op, Python loop": "pnex", graph_variant: "graph"}
    for row in rows:
        field = results.get(keys.get(row.variant, row.variant))
        if field is not None and row.seconds is not None:
            ok, text = _check_close(field, reference, 1e-3)
            row.check = (f"{'matches' if ok else 'DIFFERS from'} float64 after {total:,} steps: ") + text
            if row.variant.startswith("raw") and not ok:
                row.check += " (the documentation's kernel updates the field in place: blocks race on halos)"

    w = Workload("diffusion", f"{n}x{n}, {repeat * chunk:,} steps timed", "per step", rows, device=str(device))
    if on_gpu:
        judge_diffusion(w)
    else:
        w.headline = w.best("pnex")[0]
    return w


def judge_diffusion(w: Workload) -> None:
    """Set ``w``'s headline (its fastest pnex variant) and judge the diffusion goal on it:
    per step no slower than the raw numba-cuda loop, at least 7x eager's speed, and within
    :data:`DIFFUSION_FLOOR_GOAL` of the memory floor (one step's read and write of the
    field); where missed, say by how much."""
    w.headline, mine = w.best("pnex")
    raw_s, eager, floor = w.seconds(RAW), w.seconds(EAGER), w.seconds(FLOOR)
    w.goal = (f"fastest pnex variant <= raw numba-cuda loop, >= 7x faster than eager and <= {DIFFUSION_FLOOR_GOAL}x "
              f"the memory floor's time (one step's read + write of the field)")
    if None in (mine, raw_s, eager, floor):
        return
    w.goal_met = mine <= raw_s and eager / mine >= 7 and mine <= DIFFUSION_FLOOR_GOAL * floor
    missed = []
    if mine > raw_s:
        missed.append(f"{w.headline} takes {_fmt_us(mine)}, the raw loop {_fmt_us(raw_s)}")
    if eager / mine < 7:
        missed.append(f"{w.headline} is {eager / mine:.2f}x eager's speed")
    if mine > DIFFUSION_FLOOR_GOAL * floor:
        missed.append(f"{w.headline} takes {mine / floor:.2f}x the memory floor's time "
                      f"({_fmt_us(mine)} against {_fmt_us(floor)})")
    w.goal_why = "; ".join(missed)


#: The diffusion goal's bound on the fastest pnex variant's time per step, in memory floors.
DIFFUSION_FLOOR_GOAL = 1.3


# =============================================================================================
# LLTM
# =============================================================================================


class LLTM(torch.nn.Module):
    """The tutorial's LLTM cell in plain PyTorch (its "Python version")."""

    def __init__(self, input_features: int, state_size: int):
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        # 3 * state_size for input gate, output gate and candidate cell gate.
        # input_features + state_size because we will multiply with [input, h].
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size))
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.state_size)
        for weight in self.parameters():
            weight.data.uniform_(-stdv, +stdv)

    def forward(self, input, state):
        old_h, old_cell = state
        X = torch.cat([old_h, input], dim=1)
        # Compute the input, output and candidate cell gates with one MM.
        gate_weights = F.linear(X, self.weights, self.bias)
        # Split the combined gate weight matrix into its components.
        gates = gate_weights.chunk(3, dim=1)
        input_gate = torch.sigmoid(gates[0])
        output_gate = torch.sigmoid(gates[1])
        # Here we use an ELU instead of the usual tanh.
        candidate_cell = F.elu(gates[2])
        # Compute the new cell state.
        new_cell = old_cell + candidate_cell * input_gate
        # Compute the new hidden state and output.
        new_h = torch.tanh(new_cell) * output_gate
        return new_h, new_cell


def lltm_cell_reference(gates: torch.Tensor, old_cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tutorial's element-wise part (after the matmul) in eager PyTorch:
    what ``lltm_forward`` fuses into one kernel."""
    ig, og, cc = gates.chunk(3, dim=1)
    new_cell = old_cell + F.elu(cc) * torch.sigmoid(ig)
    return torch.tanh(new_cell) * torch.sigmoid(og), new_cell


def lltm_cell_backward_reference(
    grad_new_h: torch.Tensor, grad_new_cell: torch.Tensor, gates: torch.Tensor, new_cell: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tutorial's ``lltm_backward`` up to ``d_gates`` (before its matmuls), in eager
    PyTorch: what ``lltm_backward`` fuses into one kernel.  Returns (d_gates, d_old_cell)."""
    gate_in, gate_out, gate_cand = gates.chunk(3, dim=1)
    input_gate, output_gate = torch.sigmoid(gate_in), torch.sigmoid(gate_out)
    candidate_cell = F.elu(gate_cand)
    d_output_gate = torch.tanh(new_cell) * grad_new_h
    d_tanh_new_cell = output_gate * grad_new_h
    d_new_cell = (1 - torch.tanh(new_cell) ** 2) * d_tanh_new_cell + grad_new_cell
    d_old_cell = d_new_cell
    d_candidate_cell = input_gate * d_new_cell
    d_input_gate = candidate_cell * d_new_cell
    d_input_gate = d_input_gate * (1 - input_gate) * input_gate  # d_sigmoid
    d_output_gate = d_output_gate * (1 - output_gate) * output_gate
    e = gate_cand.exp()  # d_elu, alpha = 1
    d_candidate_cell = d_candidate_cell * ((gate_cand > 0).type_as(e) + ((e - 1) < 0).type_as(e) * e)
    return torch.cat([d_input_gate, d_output_gate, d_candidate_cell], dim=1), d_old_cell


class LLTMOps(NamedTuple):
    forward: Any  #: (gates, old_cell) -> (new_h, new_cell), with autograd
    backward: Any  #: (grad_new_h, grad_new_cell, gates, new_cell) -> (grad_gates, grad_old_cell)


LLTM_THREADS_PER_BLOCK = (128, 2)
_lltm_cache: dict = {}


def lltm_ops(dtype: torch.dtype = torch.float32) -> LLTMOps:
    """The LLTM's fused kernels for ``dtype`` (float32 for speed, float64 for
    gradcheck), the backward attached to the forward.  Made once per dtype."""
    if dtype in _lltm_cache:
        return _lltm_cache[dtype]
    import numba

    DTYPE = dtype
    # The kernels' float type, for literals: real(1.0) keeps float32 kernels in single
    # precision (a bare 1.0 is a float64 and would promote the arithmetic).
    real = numba.from_dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    suffix = "" if dtype == torch.float32 else "_" + str(dtype).removeprefix("torch.")

    def lltm_forward(
        gates: pnex.In(DTYPE, (None, None)),
        old_cell: pnex.In(DTYPE, ("gates.size(0)", "gates.size(1) // 3")),
        new_h: pnex.Out(DTYPE, "old_cell"),
        new_cell: pnex.Out(DTYPE, "old_cell"),
    ):
        # gates = [input, output, candidate] pre-activations, from X @ W.T + b (one matmul)
        s, b = cuda.grid(2)
        S = old_cell.shape[1]
        if b < old_cell.shape[0] and s < S:
            one = real(1.0)
            input_gate = one / (one + math.exp(-gates[b, s]))
            output_gate = one / (one + math.exp(-gates[b, S + s]))
            z = gates[b, 2 * S + s]
            candidate_cell = z if z > 0 else math.exp(z) - one  # ELU
            c = old_cell[b, s] + candidate_cell * input_gate
            new_cell[b, s] = c
            new_h[b, s] = math.tanh(c) * output_gate

    def lltm_backward(
        grad_new_h: pnex.In(DTYPE, (None, None)),
        grad_new_cell: pnex.In(DTYPE, "grad_new_h"),
        gates: pnex.In(DTYPE, ("grad_new_h.size(0)", "3 * grad_new_h.size(1)")),
        new_cell: pnex.In(DTYPE, "grad_new_h"),
        grad_gates: pnex.Out(DTYPE, "gates"),
        grad_old_cell: pnex.Out(DTYPE, "grad_new_h"),
    ):
        # Recomputes the activations from the saved gates instead of saving them.
        s, b = cuda.grid(2)
        S = new_cell.shape[1]
        if b < new_cell.shape[0] and s < S:
            one = real(1.0)
            input_gate = one / (one + math.exp(-gates[b, s]))
            output_gate = one / (one + math.exp(-gates[b, S + s]))
            z = gates[b, 2 * S + s]
            if z > 0:
                candidate_cell = z
                d_elu = one
            else:
                e = math.exp(z)
                candidate_cell = e - one
                d_elu = e
            t = math.tanh(new_cell[b, s])
            gh = grad_new_h[b, s]
            d_new_cell = (one - t * t) * output_gate * gh + grad_new_cell[b, s]
            grad_old_cell[b, s] = d_new_cell
            grad_gates[b, s] = candidate_cell * d_new_cell * input_gate * (one - input_gate)
            grad_gates[b, S + s] = t * gh * output_gate * (one - output_gate)
            grad_gates[b, 2 * S + s] = input_gate * d_new_cell * d_elu

    for fn in (lltm_forward, lltm_backward):
        fn.__name__ += suffix  # an op's name comes from its function's: one op per dtype
        fn.__qualname__ = fn.__name__
    forward = pnex.jit(n_threads=("old_cell.size(1)", "old_cell.size(0)"), threads_per_block=LLTM_THREADS_PER_BLOCK)(
        lltm_forward
    )
    backward = pnex.jit(
        n_threads=("grad_new_h.size(1)", "grad_new_h.size(0)"), threads_per_block=LLTM_THREADS_PER_BLOCK
    )(lltm_backward)
    attach_backward(forward, backward)
    _lltm_cache[dtype] = LLTMOps(forward, backward)
    return _lltm_cache[dtype]


lltm_forward, lltm_backward = lltm_ops(torch.float32)


class LLTMPnex(LLTM):
    """The LLTM with its element-wise part fused into one pnex kernel each way:
    ``gates = addmm(bias, [h, x], W.T)`` (cuBLAS), then ``lltm_forward``; autograd runs
    ``lltm_backward`` and the matmuls' own backward."""

    def __init__(self, input_features: int, state_size: int, forward_op: Any = None):
        super().__init__(input_features, state_size)
        self.forward_op = forward_op

    def forward(self, input, state):
        old_h, old_cell = state
        op = self.forward_op or lltm_ops(self.weights.dtype).forward
        X = torch.cat([old_h, input], dim=1)
        gates = torch.addmm(self.bias, X, self.weights.t())
        return op(gates, old_cell)


def _lltm_data(batch, features, state, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(batch, features, generator=g, dtype=dtype)
    h = torch.randn(batch, state, generator=g, dtype=dtype)
    C = torch.randn(batch, state, generator=g, dtype=dtype)
    return X.to(device), h.to(device), C.to(device)


def train_lltm(
    model: torch.nn.Module,
    teacher: torch.nn.Module,
    *,
    steps: int,
    seq_len: int,
    batch: int,
    lr: float = 0.5,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` for ``steps`` SGD steps to reproduce ``teacher``'s final hidden
    state over a random input sequence of ``seq_len`` steps; returns the losses."""
    p = next(model.parameters())
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(seq_len, batch, model.input_features, generator=g, dtype=p.dtype).to(p.device)

    def run(cell):
        h = torch.zeros(batch, cell.state_size, dtype=p.dtype, device=p.device)
        c = torch.zeros_like(h)
        for x in xs:
            h, c = cell(x, (h, c))
        return h

    with torch.no_grad():
        target = run(teacher)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(run(model), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def bench_lltm(
    batch: int = 16,
    features: int = 32,
    state: int = 128,
    *,
    device: torch.device | str | None = None,
    forward_op: Any = None,
    repeat: int = 10,
    loops: int = 50,
    compile_variants: bool = True,
    rounds: int | None = None,
    compile_modes: tuple[str, ...] = ("default", "reduce-overhead"),
) -> Workload:
    """Forward + backward of one LLTM step, as the tutorial measures it:
    ``new_h, new_C = rnn(X, (h, C)); (new_h.sum() + new_C.sum()).backward()``; every
    variant in each of ``rounds`` interleaved rounds.  The eager model is compiled in
    each of ``compile_modes`` (the CUDA-graph modes on a GPU only); the pnex model in
    the default mode and, on a GPU, ``reduce-overhead``."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(0)
    reference = LLTM(features, state).to(device)
    X, h, C = _lltm_data(batch, features, state, device)

    def make_pnex():
        m = LLTMPnex(features, state, forward_op=forward_op).to(device)
        m.load_state_dict(reference.state_dict())
        return m

    def fwd_bwd(rnn, graphs=False):
        # A training step's gradients: set to None first (as optimizer.zero_grad() does),
        # so that no step reads the previous one's; with CUDA graphs, a new step is marked
        # so that the graphs' static outputs may be reused.
        rnn.zero_grad(set_to_none=True)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        new_h, new_C = rnn(X, (h, C))
        (new_h.sum() + new_C.sum()).backward()
        return new_h, new_C

    def once(rnn, graphs=False):
        new_h, new_C = fwd_bwd(rnn, graphs)
        return [t.detach().clone() for t in (new_h, new_C, rnn.weights.grad, rnn.bias.grad)]

    expected = once(reference)

    def variant(name, rnn, *, check=True, graphs=False):
        def run():
            text = ""
            if check:
                got = once(rnn, graphs)
                oks, errs = zip(*(_check_close(a, e, 1e-4) for a, e in zip(got, expected)))
                worst = max(errs, key=lambda s: float(s.split("largest difference ", 1)[1].split()[0]))
                text = ("matches eager: " if all(oks) else "DIFFERS from eager: ") + worst + " (outputs and grads)"
            m = time_per_call(lambda: fwd_bwd(rnn, graphs), device, repeat=repeat, loops=loops, warmup=5)
            host = host_seconds(lambda: fwd_bwd(rnn, graphs), device) if device.type == "cuda" else None
            return Row(name, m.median, check=text, host_seconds=host)

        return run

    rows: list[Row] = []
    variants = [(EAGER, variant(EAGER, reference, check=False))]
    graph_modes = ("reduce-overhead", "max-autotune")  # the modes that capture CUDA graphs
    for mode in compile_modes if compile_variants else ():
        if mode in graph_modes and device.type != "cuda":
            continue
        twin = LLTM(features, state).to(device)
        twin.load_state_dict(reference.state_dict())
        name = {"default": COMPILED, "reduce-overhead": COMPILED_GRAPHS}.get(mode, f"torch.compile(mode='{mode}')")
        compiled = torch.compile(twin) if mode == "default" else torch.compile(twin, mode=mode)
        variants.append((name, variant(name, compiled, graphs=mode in graph_modes)))
    variants.append(("pnex fused kernels (eager)", variant("pnex fused kernels (eager)", make_pnex())))
    if compile_variants:
        name = "pnex fused kernels in torch.compile"
        variants.append((name, variant(name, torch.compile(make_pnex(), fullgraph=True))))
    if compile_variants and device.type == "cuda":
        # CUDA graphs remove the per-launch cost that dominates at the tutorial's size;
        # measured for both, so that neither side is compared with a handicapped other.
        name = "pnex fused kernels in torch.compile(mode='reduce-overhead')"
        variants.append((name, variant(name, torch.compile(make_pnex(), mode="reduce-overhead", fullgraph=True),
                                       graphs=True)))
    _run_rounds(rows, variants, rounds)

    w = Workload("LLTM", f"batch {batch}, {features} features, state {state}", "forward+backward", rows,
                 device=str(device))
    w.headline, mine = w.best("pnex")
    if device.type == "cuda":
        eager = w.seconds(EAGER)
        _, compiled = w.best("torch.compile")
        if (batch, features, state) == (16, 32, 128):
            w.goal = "fastest pnex variant faster than eager and every torch.compile variant in every round"
            ours = [r.variant for r in w.rows if r.variant.startswith("pnex")]
            theirs = [r.variant for r in w.rows if not r.variant.startswith("pnex")]
            verdicts = _each_round(w, ours, theirs)
            w.goal_met = None if not verdicts or None in verdicts else all(verdicts)
            w.goal += f" ({sum(v is True for v in verdicts)} of {len(verdicts)} rounds)"
            if w.goal_met is False:
                w.goal_why = _rounds_lost(w, ours, theirs)
        else:
            w.goal = "fastest pnex variant no slower than eager"
            if None not in (mine, eager):
                w.goal_met = mine <= eager
                if not w.goal_met:
                    w.goal_why = f"{w.headline} takes {_fmt_us(mine)}, eager {_fmt_us(eager)}"
    return w


def _rounds_lost(w: Workload, ours: list[str], theirs: list[str]) -> str:
    """The rounds the pnex variants lost, and to which variant: "lost round 2:
    torch.compile 512.0 µs against 518.3 µs"."""
    by_name = {r.variant: r.rounds for r in w.rows}

    def at(name: str, i: int) -> float | None:
        times = by_name.get(name) or []
        return times[i] if i < len(times) else None

    lost = []
    for i in range(max((len(v) for v in by_name.values()), default=0)):
        mine = [at(n, i) for n in ours if at(n, i) is not None]
        if not mine:
            continue
        beaten = sorted((at(n, i), n) for n in theirs if at(n, i) is not None and at(n, i) <= min(mine))
        if beaten:
            lost.append(f"round {i + 1}: {beaten[0][1]} {_fmt_us(beaten[0][0])} against {_fmt_us(min(mine))}")
    return "lost " + ", ".join(lost) if lost else ""


# =============================================================================================
# k-means assignment
# =============================================================================================


POINTS_PER_THREAD = 4  # also in n_threads below: (points.size(0) + 3) // 4 threads
_kmeans_cache: dict = {}


def kmeans_ops(labels_dtype: torch.dtype = torch.int64) -> Any:
    """The assignment kernel, writing ``labels_dtype`` labels: int64 as ``argmin`` does, or
    int32, 4 bytes less per point to write.  Made once per dtype."""
    if labels_dtype in _kmeans_cache:
        return _kmeans_cache[labels_dtype]
    LABELS = labels_dtype

    def kmeans_assign(
        points: pnex.In("f32", (None, 2)),
        centroids: pnex.In("f32", (None, 2)),
        labels: pnex.Out(LABELS, ("points.size(0)",)),
    ):
        # Each thread assigns POINTS_PER_THREAD points, one block width apart (so that a
        # warp's loads and stores are contiguous): it loads them all, compares them with
        # every centroid, then stores their labels.  Several loads in flight per thread
        # are what it takes to keep the GPU's memory busy.
        n = points.shape[0]
        first = cuda.blockIdx.x * cuda.blockDim.x * POINTS_PER_THREAD + cuda.threadIdx.x
        x = cuda.local.array(POINTS_PER_THREAD, float32)
        y = cuda.local.array(POINTS_PER_THREAD, float32)
        best_d = cuda.local.array(POINTS_PER_THREAD, float32)
        best = cuda.local.array(POINTS_PER_THREAD, int64)
        for j in range(POINTS_PER_THREAD):
            i = first + j * cuda.blockDim.x
            x[j] = points[i, 0] if i < n else float32(0.0)
            y[j] = points[i, 1] if i < n else float32(0.0)
            best_d[j] = float32(math.inf)
            best[j] = -1
        for k in range(centroids.shape[0]):  # on a tie the first centroid wins, as in argmin
            cx = centroids[k, 0]
            cy = centroids[k, 1]
            for j in range(POINTS_PER_THREAD):
                dx = x[j] - cx
                dy = y[j] - cy
                d = dx * dx + dy * dy
                if d < best_d[j]:
                    best_d[j] = d
                    best[j] = k
        for j in range(POINTS_PER_THREAD):
            i = first + j * cuda.blockDim.x
            if i < n:
                labels[i] = best[j]

    if labels_dtype != torch.int64:
        kmeans_assign.__name__ += "_" + str(labels_dtype).removeprefix("torch.")  # one op per dtype
        kmeans_assign.__qualname__ = kmeans_assign.__name__
    op = pnex.jit(n_threads="(points.size(0) + 3) // 4", threads_per_block=256)(kmeans_assign)
    _kmeans_cache[labels_dtype] = op
    return op




def kmeans_tuned_ops(labels_dtype: torch.dtype = torch.int64) -> Any:
    """The assignment kernel of :func:`kmeans_ops` as pnex makes it easy to tune: how many
    points each thread assigns (``POINTS``) and the block size are the autotuner's choice
    (the fastest on this GPU and these shapes, timed at the first call and kept on disk),
    and the tensors are read through ``.flat``.  Made once per dtype."""
    if ("tuned", labels_dtype) in _kmeans_cache:
        return _kmeans_cache[("tuned", labels_dtype)]
    LABELS = labels_dtype

    def kmeans_tuned(
        points: pnex.In("f32", (None, 2)),
        centroids: pnex.In("f32", (None, 2)),
        labels: pnex.Out(LABELS, ("points.size(0)",)),
        POINTS: pnex.Tune(1, 2, 4, 8, 16),
    ):
        # Each thread assigns POINTS points, one block width apart (a warp's loads and
        # stores cover consecutive memory): it loads them all (many loads in flight keep
        # the memory busy), compares them with every centroid, then stores their labels.
        # The tensors are read through .flat, in memory order (point i's x at xy[2 * i],
        # its y next to it): points[i, 0] would also wrap a negative i and multiply by the
        # row length read at run time, 64-bit integer work for every point.
        n = points.shape[0]
        xy = points.flat
        cxy = centroids.flat
        out = labels.flat
        first = cuda.blockIdx.x * cuda.blockDim.x * POINTS + cuda.threadIdx.x
        x = cuda.local.array(POINTS, float32)
        y = cuda.local.array(POINTS, float32)
        best_d = cuda.local.array(POINTS, float32)
        best = cuda.local.array(POINTS, int32)
        for j in range(POINTS):
            i = first + j * cuda.blockDim.x
            x[j] = float32(0.0)
            y[j] = float32(0.0)
            if i < n:
                x[j] = xy[2 * i]
                y[j] = xy[2 * i + 1]
            best_d[j] = float32(math.inf)
            best[j] = -1
        for k in range(centroids.shape[0]):  # on a tie the first centroid wins, as in argmin
            cx = cxy[2 * k]
            cy = cxy[2 * k + 1]
            for j in range(POINTS):
                dx = x[j] - cx
                dy = y[j] - cy
                d = dx * dx + dy * dy
                if d < best_d[j]:
                    best_d[j] = d
                    best[j] = k
        for j in range(POINTS):
            i = first + j * cuda.blockDim.x
            if i < n:
                out[i] = best[j]

    kmeans_tuned.__name__ += "_" + str(labels_dtype).removeprefix("torch.")  # one op per dtype
    kmeans_tuned.__qualname__ = kmeans_tuned.__name__
    op = pnex.jit(n_threads="(points.size(0) + POINTS - 1) // POINTS", threads_per_block="auto")(kmeans_tuned)
    _kmeans_cache[("tuned", labels_dtype)] = op
    return op


kmeans_assign = kmeans_ops(torch.int64)


def kmeans_reference(X: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """The tutorial's NumPy step, ``np.argmin(np.linalg.norm(X - means[:, None], axis=2),
    axis=0)``, in PyTorch."""
    return torch.argmin(torch.linalg.norm(X - means[:, None], dim=2), dim=0)


def kmeans_data(n_points: int, device: torch.device | str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The tutorial's data in float32: two Gaussian blobs around (5, 5) and (10, 10),
    ``n_points // 2`` points each, and those two centres as the means."""
    g = torch.Generator().manual_seed(seed)
    half = n_points // 2
    centres = torch.tensor([[5.0, 5.0], [10.0, 10.0]])
    X = centres.repeat_interleave(torch.tensor([half, n_points - half]), dim=0)
    X = X + torch.randn(X.shape, generator=g)
    return X.to(device), centres.to(device)


def check_labels(labels: torch.Tensor, expected: torch.Tensor, X: torch.Tensor, means: torch.Tensor) -> tuple[bool, str]:
    """Labels agree with the reference's, or differ only where two centroids are equally
    near (to float32 rounding)."""
    differ = labels != expected
    n = int(differ.sum())
    if n == 0:
        return True, "identical labels"
    pts = X[differ].double()
    m = means.double()
    d_got = ((pts - m[labels[differ]]) ** 2).sum(1).sqrt()
    d_ref = ((pts - m[expected[differ]]) ** 2).sum(1).sqrt()
    gap = float((d_got - d_ref).abs().max())
    ok = gap <= 1e-5 * float(d_ref.abs().max() + 1)
    return ok, f"{n} of {labels.numel()} labels differ, all at ties (distance gap {gap:.1e})" if ok else (
        f"{n} of {labels.numel()} labels differ (distance gap up to {gap:.1e})"
    )


#: The row of :func:`kmeans_tuned_ops`, timed beside the kernel of notebook 04 (``tuned=True``).
TUNED_KMEANS = "pnex kernel, Tune(POINTS) and block autotuned"


def bench_kmeans(
    n_points: int = 20_000_000,
    *,
    labels_dtype: torch.dtype = torch.int64,
    device: torch.device | str | None = None,
    op: Any = None,
    repeat: int = 10,
    loops: int = 20,
    compile_variants: bool = True,
    rounds: int | None = None,
    tuned: bool = True,
) -> Workload:
    """The assignment step writing ``labels_dtype`` labels: the pnex kernel against the
    tutorial's function (its int64 result cast to ``labels_dtype``, if need be), eager and
    compiled, and the memory floor for the bytes the step must move; every variant in
    each of ``rounds`` interleaved rounds."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    op = op or kmeans_ops(labels_dtype)
    X, means = kmeans_data(n_points, device)
    if labels_dtype == torch.int64:
        reference = kmeans_reference
    else:

        def reference(X, means):
            return kmeans_reference(X, means).to(labels_dtype)

    expected = reference(X, means)
    rows: list[Row] = []

    def variant(name, fn, check=True):
        def run():
            text = ""
            if check:
                got = fn(X, means)
                ok, text = check_labels(got, expected, X, means)
                if got.dtype != labels_dtype:
                    ok, text = False, f"labels are {got.dtype}, not {labels_dtype}"
                text = ("matches eager: " if ok else "DIFFERS from eager: ") + text
            m = time_per_call(lambda: fn(X, means), device, repeat=repeat, loops=loops)
            return Row(name, m.median, check=text)

        return run

    variants = [(EAGER, variant(EAGER, reference, check=False))]
    if compile_variants:
        variants.append((COMPILED, variant(COMPILED, torch.compile(reference, fullgraph=True))))
    variants.append(("pnex kernel", variant("pnex kernel", op)))
    if tuned:
        variants.append((TUNED_KMEANS, variant(TUNED_KMEANS, kmeans_tuned_ops(labels_dtype))))
    itemsize = torch.empty(0, dtype=labels_dtype).element_size()
    if device.type == "cuda":
        moved = X.numel() * X.element_size() + n_points * itemsize  # read the points, write the labels
        variants.append((FLOOR, lambda: copy_time(moved, device, repeat=repeat, loops=loops)))
    _run_rounds(rows, variants, rounds)
    labels_name = str(labels_dtype).removeprefix("torch.")
    w = Workload(f"k-means ({labels_name} labels)", f"{n_points:,} points, {means.shape[0]} centroids", "per call",
                 rows, device=str(device))
    w.headline, mine = w.best("pnex")
    if device.type == "cuda":
        floor, compiled = w.seconds(FLOOR), w.seconds(COMPILED)
        w.goal = "within 1.3x of the memory floor's time and faster than torch.compile"
        if None not in (mine, floor, compiled):
            w.goal_met = mine <= 1.3 * floor and mine < compiled
            w.goal_why = _kmeans_why(mine, floor, compiled) if not w.goal_met else ""
    return w


#: A time within this factor of the memory floor's is at the floor: no kernel moving the same
#: bytes can be measurably faster.
AT_FLOOR = 1.05


def _kmeans_why(mine: float, floor: float, compiled: float) -> str:
    """Why the k-means goal was missed, from the times: too far from the floor, or not
    faster than torch.compile, and whether torch.compile was at the floor already."""
    why = []
    if mine > 1.3 * floor:
        why.append(f"the pnex kernel takes {mine / floor:.2f}x the floor's time")
    if mine >= compiled:
        if mine <= AT_FLOOR * floor and compiled <= AT_FLOOR * floor:
            why.append(f"a tie with torch.compile ({_fmt_us(mine)} against {_fmt_us(compiled)}): both run at the "
                       f"memory floor's speed ({floor / mine:.2f}x and {floor / compiled:.2f}x): a kernel moving these "
                       f"bytes cannot get much faster than a copy of them")
        else:
            why.append(f"torch.compile is faster: {_fmt_us(compiled)} against {_fmt_us(mine)} "
                       f"({floor / compiled:.2f}x the floor's speed against the pnex kernel's {floor / mine:.2f}x)")
    return "; ".join(why)


# =============================================================================================
# Command line
# =============================================================================================

FULL_SIZES = {
    "diffusion": [dict(n=2000, steps=10_000)],
    "lltm": [dict(batch=16, features=32, state=128), dict(batch=4096, features=256, state=1024)],
    "kmeans": [dict(n_points=20_000_000), dict(n_points=20_000_000, labels_dtype=torch.int32)],
}
SMOKE_SIZES = {
    "diffusion": [dict(n=24, steps=8, repeat=2)],
    "lltm": [dict(batch=2, features=3, state=4, repeat=2, loops=1)],
    "kmeans": [dict(n_points=96, repeat=2, loops=1), dict(n_points=96, labels_dtype=torch.int32, repeat=2, loops=1)],
}


def run(only: list[str], smoke: bool, compile_variants: bool = True) -> list[Workload]:
    sizes = SMOKE_SIZES if smoke else FULL_SIZES
    benches = {"diffusion": bench_diffusion, "lltm": bench_lltm, "kmeans": bench_kmeans}
    workloads = []
    for name in only:
        for kwargs in sizes[name]:
            print(f"running {name} {kwargs} ...", flush=True)
            start = time.perf_counter()
            w = benches[name](compile_variants=compile_variants, **kwargs)
            print(f"  done in {time.perf_counter() - start:.1f} s", flush=True)
            workloads.append(w)
    return workloads


def main(argv: list[str] | None = None) -> int:
    global _TRACEBACKS, ROUNDS
    opts = build_parser().parse_args(argv)
    _TRACEBACKS = True
    ROUNDS = opts.rounds or (2 if opts.smoke else ROUNDS)
    env = environment()
    print(f"device: {env['device']}")
    if not opts.smoke and not torch.cuda.is_available():
        print("workloads.py measures GPU kernels and needs an NVIDIA GPU; use --smoke to check it runs here.")
        return 1
    workloads = run(opts.only, opts.smoke, compile_variants=not opts.no_compile)
    table = format_table(workloads)
    print()
    print(table)
    if opts.smoke:
        print("\n(smoke run: tiny sizes" + ("" if torch.cuda.is_available() else ", CPU simulator times mean nothing")
              + "; goals are judged at full size only)")
    result = {
        "benchmark": "workloads",
        "smoke": opts.smoke,
        "rounds": ROUNDS,
        **env,
        "workloads": [w.to_json() for w in workloads],
        "table": table,
    }
    if torch.cuda.is_available():
        result["dram_copy_bandwidth_GBps"] = dram_copy_bandwidth("cuda") / 1e9
        print(f"\nDRAM copy bandwidth (1 GiB copy): {result['dram_copy_bandwidth_GBps']:.0f} GB/s")
    out = opts.out
    if out is None and not opts.smoke:
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"workloads-{_dt.datetime.now().strftime('%Y-%m-%d-%H%M')}.json"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {out}")
    judged = [w for w in workloads if w.goal_met is not None]
    if judged:
        print(f"goals met: {sum(w.goal_met for w in judged)} of {len(judged)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
