"""Timing and correctness of a pnex op against an eager PyTorch reference.

:func:`evaluate` runs the op and the reference on fresh copies of the same example
arguments, compares their results in float64 (:class:`Correctness`) and, when the
arguments are CUDA tensors, times both with CUDA events (:class:`Measurement`).
The result is a :class:`TimingResult`, a plain object in the style of IPython's
``TimeitResult``: documented attributes, statistics as properties, ``str`` for
people and ``_repr_pretty_`` for the REPL.

Without a GPU nothing is timed: the simulator's speed says nothing about the
kernel's, so the result says why there are no timings and only carries the
correctness check.

The statistics (:func:`measure`) take the clock as an argument, so they are
tested on CPU with a fake timer; :mod:`pnex_magic.timers` holds the real ones
(CUDA events, CUDA-graph replays).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from .timers import CaptureRefused, Timer, cuda_event_timer, cuda_graph_timer

__all__ = [
    "Measurement",
    "Correctness",
    "Mismatch",
    "TimingResult",
    "Timer",
    "measure",
    "cuda_event_timer",
    "cuda_graph_timer",
    "CaptureRefused",
    "compare_outputs",
    "tensor_bytes",
    "clone_args",
    "as_tensor_list",
    "evaluate",
    "format_time",
    "format_bytes",
    "rate_unit",
    "format_rate",
]


def format_time(seconds: float | None, precision: int = 3) -> str:
    """``1.23 µs``, ``45.6 ms``: a duration with a unit chosen for it (as ``%timeit``)."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds <= 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if seconds >= scale:
            return f"{seconds / scale:.{precision}g} {unit}"
    return f"{seconds / 1e-9:.{precision}g} ns"


def format_bytes(n: float | None) -> str:
    """``256 MiB``, ``8 KiB``: an amount of memory in binary units (KiB, MiB, GiB), as
    capacities are given (an H200's L2: 60 MiB); rates stay decimal (GB/s, TB/s:
    :func:`format_rate`), as bandwidths are given."""
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def rate_unit(*values: float | None) -> tuple[float, str]:
    """``(1e12, "TB/s")``, ``(1e9, "GB/s")`` or ``(1e6, "MB/s")``: one unit for a set of
    rates, chosen by the largest, so that figures shown side by side are read in the
    same unit."""
    top = max((v for v in values if v), default=0.0)
    return (1e12, "TB/s") if top >= 1e12 else (1e9, "GB/s") if top >= 1e9 else (1e6, "MB/s")


def format_rate(bytes_per_second: float, unit: tuple[float, str] | None = None) -> str:
    """``2.28 TB/s``, ``850 GB/s``: in ``unit`` (default: the rate's own, :func:`rate_unit`),
    unless the rate is under a hundredth of that unit (``0.000841 TB/s``), which is
    written in its own unit instead (``841 MB/s``)."""
    scale, name = unit or rate_unit(bytes_per_second)
    if bytes_per_second < 0.01 * scale:
        scale, name = rate_unit(bytes_per_second)
    return f"{bytes_per_second / scale:.3g} {name}"


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Repeated timings of one callable: ``repeat`` runs of ``loops`` calls each.

    ``all_runs`` holds the seconds each run took (all ``loops`` calls), like
    ``TimeitResult.all_runs``; the statistics are per call.
    """

    loops: int
    repeat: int
    all_runs: tuple[float, ...]
    warmup: int = 0

    @property
    def timings(self) -> list[float]:
        """Seconds per call, one entry per run."""
        return [t / self.loops for t in self.all_runs]

    @property
    def median(self) -> float:
        return statistics.median(self.timings)

    def _quartiles(self) -> tuple[float, float]:
        t = sorted(self.timings)
        if len(t) < 2:
            return t[0], t[0]
        q = statistics.quantiles(t, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def q1(self) -> float:
        return self._quartiles()[0]

    @property
    def q3(self) -> float:
        return self._quartiles()[1]

    @property
    def iqr(self) -> float:
        """Interquartile range: the spread of the middle half of the runs."""
        q1, q3 = self._quartiles()
        return q3 - q1

    @property
    def best(self) -> float:
        return min(self.timings)

    @property
    def worst(self) -> float:
        return max(self.timings)

    @property
    def average(self) -> float:
        return statistics.fmean(self.timings)

    @property
    def stdev(self) -> float:
        t = self.timings
        return statistics.stdev(t) if len(t) > 1 else 0.0

    def __str__(self) -> str:
        return (
            f"{format_time(self.median)} median (IQR {format_time(self.q1)} – {format_time(self.q3)}, "
            f"min {format_time(self.best)}; {self.repeat} runs × {self.loops} loops)"
        )

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("Measurement(...)" if cycle else f"<Measurement: {self}>")


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One element of the op's results against the reference's."""

    output: str  #: which result ("result", or "a (mutated)")
    index: tuple[int, ...]
    actual: Any
    expected: Any

    def __str__(self) -> str:
        where = self.output.split(" ")[0] + (f"[{', '.join(map(str, self.index))}]" if self.index else "")
        return f"{where} = {self.actual:.6g} where eager gives {self.expected:.6g}"


@dataclasses.dataclass(frozen=True)
class Correctness:
    """The op's results against the eager reference's, compared in float64.

    ``ok`` applies the tolerances of ``torch.testing.assert_close`` for the op's output
    dtype (exact for integers) to every element: ``|op - ref| <= atol + rtol * |ref|``.
    ``max_abs_error`` is the largest ``|op - ref|``; :attr:`scaled_error` divides it by
    the largest ``|ref|``, which reads right for data near zero, where
    ``max_rel_error`` (taken element by element over nonzero references) is large
    for a difference of one rounding.  ``worst`` is the element farthest outside the
    tolerance, when one is.
    """

    max_abs_error: float
    max_rel_error: float
    ok: bool
    compared: tuple[str, ...]  #: which results were compared ("result", or "a (mutated)")
    rtol: float = 0.0
    atol: float = 0.0
    note: str = ""  #: why the results could not be compared, when they could not
    where: str = ""  #: how the op ran ("CUDA simulator", "cuda:0")
    max_reference: float = 0.0  #: the largest |reference| over the compared elements
    elements: int = 0  #: elements compared
    mismatched: int = 0  #: elements outside the tolerance
    worst: Mismatch | None = None  #: the element farthest outside the tolerance (None when all are in)

    @property
    def scaled_error(self) -> float:
        """``max |op - ref| / max |ref|``: the largest difference as a share of the
        reference's scale (0 when both are 0)."""
        if self.max_abs_error == 0:
            return 0.0
        return self.max_abs_error / self.max_reference if self.max_reference else math.inf

    @property
    def tolerance(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g}"

    def __str__(self) -> str:
        if self.note and not self.compared:
            return f"not compared: {self.note}"
        what = ", ".join(self.compared)
        if self.ok and self.max_abs_error == 0:
            text = f"matches eager: all {self.elements:,} elements of {what} identical"
        elif self.ok:
            text = (f"matches eager: all {self.elements:,} elements of {what} within {self.tolerance} (float64); "
                    f"largest difference {self.max_abs_error:.3g}, {self.scaled_error:.2g} of the largest reference "
                    f"value")
        else:
            text = (f"DIFFERS from eager: {self.mismatched:,} of {self.elements:,} elements of {what} outside "
                    f"{self.tolerance}")
            if self.worst is not None:
                text += f"; worst: {self.worst}"
        return text + (f"; {self.note}" if self.note else "")

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("Correctness(...)" if cycle else f"<Correctness: {self}>")


@dataclasses.dataclass(frozen=True)
class TimingResult:
    """What ``%%pnex --args ... --eager ...`` measured.

    Attributes
    ----------
    op, eager : Measurement or None
        CUDA-event timings of the op and of the reference (around plain calls, or
        around CUDA-graph replays while the C++ launcher is built: see ``device``);
        ``None`` when not timed (no GPU, CPU arguments, or no ``--eager``).
    correctness : Correctness or None
        The op's results against the reference's (``None`` without ``--eager``).
    bytes_moved : int
        Bytes the tensor arguments and the outputs occupy: the memory traffic of
        one call if every byte is read or written once.
    device : str
        Where the op ran: ``"cuda:0 (NVIDIA H200)"`` or ``"cpu (CUDA simulator)"``.
    reason : str
        Why there are no timings, when there are none.
    """

    op: Measurement | None
    eager: Measurement | None
    correctness: Correctness | None
    bytes_moved: int
    device: str
    reason: str = ""
    name: str = "op"
    eager_name: str = "eager"

    @property
    def timed(self) -> bool:
        return self.op is not None

    @property
    def speedup(self) -> float | None:
        """Eager median / op median (above 1: the op is faster)."""
        if self.op is None or self.eager is None or self.op.median <= 0:
            return None
        return self.eager.median / self.op.median

    @property
    def bandwidth(self) -> float | None:
        """Achieved bytes per second of the op: ``bytes_moved / op.median``."""
        if self.op is None or self.op.median <= 0:
            return None
        return self.bytes_moved / self.op.median

    @property
    def eager_bandwidth(self) -> float | None:
        if self.eager is None or self.eager.median <= 0:
            return None
        return self.bytes_moved / self.eager.median

    def lines(self, unit: tuple[float, str] | None = None) -> list[str]:
        """The result as text; ``unit`` is the unit of its rate (default: its own)."""
        out = [f"timing of {self.name} on {self.device}"]
        if self.op is None:
            out.append(f"  not timed : {self.reason or 'no measurements'}")
        else:
            width = max(10, len(self.name), len(self.eager_name) if self.eager is not None else 0)
            out.append(f"  {self.name:<{width}}: {self.op}")
            if self.eager is not None:
                out.append(f"  {self.eager_name:<{width}}: {self.eager}")
            if self.speedup is not None:
                out.append(f"  speed-up  : {self.speedup:.2f}× (eager median / op median)")
            if self.bandwidth is not None:
                rate = format_rate(self.bandwidth, unit or rate_unit(self.bandwidth, self.eager_bandwidth))
                out.append(f"  bandwidth : {rate} ({format_bytes(self.bytes_moved)} of arguments and outputs per call)")
        if self.correctness is not None:
            out.append(f"  correct   : {self.correctness}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("TimingResult(...)" if cycle else str(self))


# --------------------------------------------------------------------------- statistics


def _nice_loops(n: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at least ``n``."""
    n = max(1.0, n)
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= n:
                return step * scale
        scale *= 10


def measure(
    fn: Callable[[], Any],
    timer: Timer,
    *,
    repeat: int = 7,
    loops: int | None = None,
    warmup: int = 3,
    min_run_seconds: float = 2e-3,
    max_loops: int = 100_000,
) -> Measurement:
    """Time ``fn()``: ``warmup`` calls, then ``repeat`` runs of ``loops`` calls.

    Without ``loops``, it is chosen (1, 2, 5, 10, ... as ``%timeit`` does) so that
    one run takes at least ``min_run_seconds``, judged from a one-call probe run
    after warm-up.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if warmup > 0:
        timer(fn, warmup)
    if loops is None:
        probe = timer(fn, 1)
        loops = _nice_loops(min_run_seconds / probe) if probe > 0 else max_loops
        loops = min(loops, max_loops)
    elif loops < 1:
        raise ValueError(f"loops must be at least 1, got {loops}")
    runs = tuple(float(timer(fn, loops)) for _ in range(repeat))
    return Measurement(loops=loops, repeat=repeat, all_runs=runs, warmup=warmup)


# --------------------------------------------------------------------------- correctness

# torch.testing.assert_close's default tolerances (rtol, atol) by dtype.
_TOLERANCES = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}


def as_tensor_list(value: Any) -> list[Any]:
    """An op's or a reference's result as a list: ``None`` → [], a tensor → [it],
    a tuple or list → its items."""
    if value is None:
        return []
    if isinstance(value, (tuple, list)):
        return list(value)
    return [value]


def compare_outputs(
    actual: Sequence[Any], expected: Sequence[Any], names: Sequence[str], where: str = ""
) -> Correctness:
    """Compare the op's results (``actual``) with the reference's, element-wise in float64."""
    import torch

    names = tuple(names)
    if len(actual) != len(expected):
        return Correctness(
            math.nan, math.nan, False, (), note=(
                f"the op gives {len(actual)} result(s) ({', '.join(names) or 'none'}) but the eager "
                f"reference returned {len(expected)}"
            ), where=where,
        )
    max_abs = max_rel = max_ref = 0.0
    ok = True
    notes = []
    rtol_used = atol_used = 0.0
    elements = mismatched = 0
    worst: Mismatch | None = None
    worst_excess = -math.inf
    for name, a, e in zip(names, actual, expected, strict=True):
        if not isinstance(a, torch.Tensor):
            a = torch.as_tensor(a)
        if not isinstance(e, torch.Tensor):
            try:
                e = torch.as_tensor(e)
            except Exception:
                note = f"the reference returned {type(e).__name__} for {name!r}, not a tensor"
                return Correctness(math.nan, math.nan, False, (), note=note, where=where)
        if tuple(a.shape) != tuple(e.shape):
            notes.append(f"{name}: shape {tuple(a.shape)} vs eager {tuple(e.shape)}")
            ok = False
            max_abs = max_rel = math.inf
            continue
        rtol, atol = _TOLERANCES.get(str(a.dtype).removeprefix("torch."), (0.0, 0.0))
        rtol_used, atol_used = max(rtol_used, rtol), max(atol_used, atol)
        target = torch.complex128 if (a.is_complex() or e.is_complex()) else torch.float64
        a64 = a.detach().to(device="cpu", dtype=target)
        e64 = e.detach().to(device="cpu", dtype=target)
        if a64.numel() == 0:
            continue
        diff = (a64 - e64).abs()
        a_real = a64.real if a64.is_complex() else a64
        e_real = e64.real if e64.is_complex() else e64
        both_nan = torch.isnan(a_real) & torch.isnan(e_real)
        diff = torch.where(both_nan, torch.zeros_like(diff), diff)
        same_inf = torch.isinf(a_real) & (a64 == e64)
        diff = torch.where(same_inf, torch.zeros_like(diff), diff)
        diff = torch.nan_to_num(diff, nan=math.inf)
        ref = e64.abs()
        max_abs = max(max_abs, float(diff.max()))
        max_ref = max(max_ref, float(torch.nan_to_num(ref, nan=0.0, posinf=0.0).max()))
        nonzero = ref > 0
        if bool(nonzero.any()):
            max_rel = max(max_rel, float((diff[nonzero] / ref[nonzero]).max()))
        excess = diff - (atol + rtol * torch.nan_to_num(ref, posinf=0.0))
        outside = excess > 0
        elements += a64.numel()
        mismatched += int(outside.sum())
        if bool(outside.any()):
            ok = False
            flat = int(torch.argmax(torch.nan_to_num(excess, nan=math.inf)))
            if float(excess.flatten()[flat]) > worst_excess:
                worst_excess = float(excess.flatten()[flat])
                index = _unravel(flat, tuple(a64.shape))
                worst = Mismatch(name, index, a64.flatten()[flat].item(), e64.flatten()[flat].item())
        if a.dtype != e.dtype:
            op_dtype, ref_dtype = (str(d).removeprefix("torch.") for d in (a.dtype, e.dtype))
            notes.append(f"{name}: op dtype {op_dtype}, eager {ref_dtype}")
    return Correctness(max_abs, max_rel, ok, names, rtol_used, atol_used, "; ".join(notes), where, max_ref, elements,
                       mismatched, worst)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index of element ``flat`` of a contiguous tensor of ``shape``, in plain Python:
    ``torch.unravel_index`` imports sympy (through torch's symbolic shapes) on first use,
    1-2 s of a fresh notebook's first report when its kernel disagrees with eager."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size) if size else (flat, 0)
        index.append(i)
    return tuple(reversed(index))


def tensor_bytes(*values: Any) -> int:
    """Bytes held by the tensors among ``values`` (searching tuples and lists)."""
    import torch

    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, (tuple, list)):
            total += tensor_bytes(*v)
    return total


def clone_args(args: Sequence[Any]) -> tuple[Any, ...]:
    """A fresh copy of every tensor argument (strides kept), so an ``InMut`` write by
    one run is not seen by the next."""
    import torch

    return tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)


def _device_of(args: Sequence[Any]):
    import torch

    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def _describe_device(device) -> str:
    import torch

    if device is None or device.type == "cpu":
        return "cpu (CUDA simulator)"
    if device.type == "cuda":
        try:
            return f"{device} ({torch.cuda.get_device_name(device)})"
        except Exception:
            return str(device)
    return str(device)


def evaluate(
    op: Callable[..., Any],
    args: Sequence[Any],
    eager: Callable[..., Any] | None = None,
    *,
    output_names: Sequence[str] = ("result",),
    mutated: Sequence[int] = (),
    mutated_names: Sequence[str] = (),
    name: str = "op",
    eager_name: str = "eager",
    op_run: tuple[Any, tuple[Any, ...]] | None = None,
    eager_run: tuple[Any, tuple[Any, ...]] | None = None,
    time_it: bool | None = None,
    repeat: int = 7,
    timer: Timer | None = None,
    graphs: bool = False,
) -> TimingResult:
    """Check ``op(*args)`` against ``eager(*args)`` and, on CUDA, time both.

    Every run gets fresh copies of the tensor arguments.  The results compared are
    the op's outputs or, for an op without outputs, its mutated arguments
    (positions ``mutated``, named ``mutated_names``) after the call.  ``op_run`` and
    ``eager_run`` (a result and the argument copies it ran on) reuse runs already
    made.  ``time_it`` defaults to "the arguments are CUDA tensors"; ``timer``
    defaults to :func:`cuda_event_timer`, or with ``graphs`` to :func:`cuda_graph_timer`
    (which raises :class:`CaptureRefused` for a function that cannot be captured).
    """
    import torch

    device = _device_of(args)
    where = _describe_device(device)
    on_gpu = device is not None and device.type == "cuda"
    with torch.no_grad():
        if op_run is None:
            copies = clone_args(args)
            op_run = (op(*copies), copies)
        if eager is not None and eager_run is None:
            copies = clone_args(args)
            eager_run = (eager(*copies), copies)
        if on_gpu:
            torch.cuda.synchronize(device)
        correctness = None
        if eager_run is not None:
            correctness = _check(op_run, eager_run, output_names, mutated, mutated_names, where)
        moved = tensor_bytes(*args) + tensor_bytes(op_run[0])
        if time_it is None:
            time_it = on_gpu
        if not time_it:
            if on_gpu:
                reason = "timing was not asked for"
            elif torch.cuda.is_available():
                reason = ("the --args tensors are on the CPU, so the op ran in the CUDA simulator; "
                          "pass CUDA tensors to time it")
            else:
                reason = ("no CUDA GPU here: the op ran in the CUDA simulator, "
                          "whose speed says nothing about the kernel's")
            return TimingResult(None, None, correctness, moved, where, reason, name, eager_name)
        timer = timer or (cuda_graph_timer if graphs else cuda_event_timer)(device)
        op_args = clone_args(args)
        op_time = measure(lambda: op(*op_args), timer, repeat=repeat)
        eager_time = None
        if eager is not None:
            eager_args = clone_args(args)
            eager_time = measure(lambda: eager(*eager_args), timer, repeat=repeat)
    return TimingResult(op_time, eager_time, correctness, moved, where, "", name, eager_name)


def _check(op_run, eager_run, output_names, mutated, mutated_names, where) -> Correctness:
    op_out, op_args = op_run
    ref_out, ref_args = eager_run
    actual = as_tensor_list(op_out)
    if actual:
        return compare_outputs(actual, as_tensor_list(ref_out), output_names, where)
    if mutated:
        return compare_outputs(
            [op_args[i] for i in mutated],
            [ref_args[i] for i in mutated],
            [f"{n} (mutated)" for n in mutated_names],
            where,
        )
    return Correctness(math.nan, math.nan, False, (), note="the op has no outputs and mutates nothing", where=where)
