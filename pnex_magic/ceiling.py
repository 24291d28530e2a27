"""The practical bandwidth ceiling of a timed call: the fastest rate a streaming kernel
reaches on this GPU at the call's mix of reads and writes.

A device-to-device copy alone understates it.  The memory does not move every mix of
reads and writes at one rate (the bus turns around between them), and a memcpy is not
the fastest 1:1 kernel either: on an H100 whose copy measured 2.84 TB/s in the same
process, torch.compile's fused ``a * b + 0.5`` (two reads to one write) ran at
2.87 TB/s, and a pnex k-means step (one read to one write) at 2.92 TB/s against a copy
of 2.85 (``notebooks/05_colab.ipynb``, ``04_kmeans.ipynb``, saved from H100 runs).

So :func:`measure` times torch's own vectorised streaming kernels once per process and
device (:data:`KERNELS`: a write-only fill, the memcpy and a one-input elementwise
kernel, elementwise kernels of two and three inputs, a read-only sum), on float32
tensors at least four times the L2 (no timed call is served from the cache), and keeps
each kernel's fastest run of :data:`RUNS`: the ceiling is what the memory was seen to
allow, and a slower run is the clock or a neighbour, not the memory.  :func:`ceiling_at`
gives a call's ceiling from them: the fastest kernel at the call's read share (the
bytes it reads over the bytes it reads and writes), linearly interpolated between the
two nearest measured mixes where none matches.  Both are pure functions of recorded
figures but :func:`measure`, so the rules are tested without a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .hardware import device_info
from .timers import Timer, cuda_event_timer
from .timing import format_bytes, format_rate, measure as _time, rate_unit

__all__ = ["Stream", "KERNELS", "RUNS", "MemoryCeiling", "ceiling_at", "measure", "time_streams", "mix_text", "LISTING"]

#: Runs of each streaming kernel; the fastest is kept.
RUNS = 10
#: Calls per timed run (after two calls of warm-up).
LOOPS = 3
#: Bytes of one tensor of the measurement: at least this, and at least four times the L2.
MIN_TENSOR_BYTES = 128 << 20
_SAME = 1e-9  #: read shares this close are one mix
#: How :meth:`MemoryCeiling.listing` begins, for readers of a report's text (the kernels' rates
#: there are of other mixes than the call's: tests/test_notebook_truth.py leaves them out).
LISTING = "torch's streaming kernels"


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A torch streaming kernel on float32 tensors ``x, y, w`` (read) and ``z`` (written)."""

    name: str
    code: str  #: what it runs, as the report shows it
    reads: int  #: tensors read per element
    writes: int  #: tensors written per element
    run: Callable[..., Any]


#: The kernels :func:`measure` times, each on float32 tensors.
KERNELS = (
    Kernel("fill", "z.fill_(1.0)", 0, 1, lambda x, y, w, z: z.fill_(1.0)),
    Kernel("copy", "z.copy_(x), a device-to-device memcpy", 1, 1, lambda x, y, w, z: z.copy_(x)),
    Kernel("scale", "torch.mul(x, 2.0, out=z)", 1, 1, lambda x, y, w, z: torch.mul(x, 2.0, out=z)),
    Kernel("add", "torch.add(x, y, out=z)", 2, 1, lambda x, y, w, z: torch.add(x, y, out=z)),
    Kernel("addcmul", "torch.addcmul(x, y, w, out=z)", 3, 1, lambda x, y, w, z: torch.addcmul(x, y, w, out=z)),
    Kernel("sum", "torch.sum(x)", 1, 0, lambda x, y, w, z: torch.sum(x)),
)


def mix_text(reads: int, writes: int) -> str:
    """``2 reads : 1 write``, ``reads only``, ``writes only``."""
    if not writes:
        return "reads only"
    if not reads:
        return "writes only"
    return f"{reads} read{'s' if reads != 1 else ''} : {writes} write{'s' if writes != 1 else ''}"


@dataclasses.dataclass(frozen=True)
class Stream:
    """One streaming kernel as measured on a device."""

    name: str  #: ``add``
    code: str  #: ``torch.add(x, y, out=z)``
    reads: int  #: tensors read per element
    writes: int  #: tensors written per element
    bandwidth: float  #: bytes read + written per second, the fastest of the runs
    tensor_bytes: int = 0  #: bytes of each tensor it ran on
    runs: int = RUNS

    @property
    def read_share(self) -> float:
        return self.reads / (self.reads + self.writes)

    @property
    def mix(self) -> str:
        return mix_text(self.reads, self.writes)


@dataclasses.dataclass(frozen=True)
class MemoryCeiling:
    """The memory ceiling of one call: the rate the streaming kernels reach at its mix."""

    bandwidth: float  #: bytes per second
    read_share: float  #: the call's: bytes read / (bytes read + bytes written)
    streams: tuple[Stream, ...]  #: everything measured on the device
    #: the kernel(s) the figure comes from: one at the call's mix, or the two it lies between
    basis: tuple[Stream, ...] = ()

    @property
    def at_mix(self) -> bool:
        """Whether a kernel measured at the call's own mix sets the figure."""
        return len(self.basis) == 1 and abs(self.basis[0].read_share - self.read_share) < _SAME

    @property
    def label(self) -> str:
        """``add (2 reads : 1 write)``; ``copy and add, interpolated``."""
        if len(self.basis) == 2:
            return f"{self.basis[0].name} and {self.basis[1].name}, interpolated"
        return f"{self.basis[0].name} ({self.basis[0].mix})"

    @property
    def short(self) -> str:
        """What sets the ceiling, in a few words: ``torch's add at this call's mix``."""
        if len(self.basis) == 2:
            return f"torch's {self.basis[0].name} and {self.basis[1].name}, interpolated to this call's mix"
        name = self.basis[0].name
        return f"torch's {name} at this call's mix" if self.at_mix else f"torch's {name}, the nearest mix measured"

    @property
    def source(self) -> str:
        """What sets the ceiling, in full."""
        if len(self.basis) == 2:
            a, b = self.basis
            return (f"between {a.code} ({a.mix}) and {b.code} ({b.mix}), interpolated to this call's mix "
                    f"({self.read_share:.0%} of its bytes read)")
        s = self.basis[0]
        where = "as this call" if self.at_mix else f"the nearest to this call's {self.read_share:.0%} of bytes read"
        return f"{s.code} ({s.mix}, {where}), the fastest streaming kernel measured at that mix"

    def listing(self, unit: tuple[float, str] | None = None) -> str:
        """``torch's streaming kernels (float32 tensors of 200 MiB each, the fastest of 10
        runs, once per process): fill 2.71, copy 2.84, ... TB/s``."""
        unit = unit or rate_unit(*(s.bandwidth for s in self.streams))
        figures = ", ".join(f"{s.name} {format_rate(s.bandwidth, unit).split()[0]}" for s in self.streams)
        size = format_bytes(self.streams[0].tensor_bytes) if self.streams else "n/a"
        runs = self.streams[0].runs if self.streams else RUNS
        return (f"{LISTING} (float32 tensors of {size} each, the fastest of {runs} runs, once per process): "
                f"{figures} {unit[1]}")


def ceiling_at(streams: Sequence[Stream], share: float) -> MemoryCeiling | None:
    """The ceiling of a call that reads ``share`` of the bytes it moves: the fastest of
    ``streams`` at that read share; between two measured shares, the straight line
    between the fastest at each; outside them, the nearest.  ``None`` without streams."""
    share = min(1.0, max(0.0, share))
    best: dict[float, Stream] = {}
    for s in streams:
        key = next((k for k in best if abs(k - s.read_share) < _SAME), s.read_share)
        if key not in best or s.bandwidth > best[key].bandwidth:
            best[key] = s
    if not best:
        return None
    points = sorted(best.items())
    lower = [s for r, s in points if r < share + _SAME]
    upper = [s for r, s in points if r > share - _SAME]
    if not lower or not upper or abs(lower[-1].read_share - share) < _SAME:
        s = lower[-1] if lower else upper[0]
        return MemoryCeiling(s.bandwidth, share, tuple(streams), (s,))
    a, b = lower[-1], upper[0]
    t = (share - a.read_share) / (b.read_share - a.read_share)
    return MemoryCeiling(a.bandwidth + t * (b.bandwidth - a.bandwidth), share, tuple(streams), (a, b))


def time_streams(tensors: Sequence[Any], timer: Timer) -> tuple[Stream, ...]:
    """Each of :data:`KERNELS` run on ``tensors`` (four float32 tensors of one size: x, y
    and w read, z written) and timed with ``timer`` (a :data:`~pnex_magic.timers.Timer`):
    two calls of warm-up, then :data:`RUNS` runs of :data:`LOOPS` calls; the fastest run."""
    n = tensors[0].numel()
    out = []
    for k in KERNELS:
        seconds = _time(lambda k=k: k.run(*tensors), timer, repeat=RUNS, loops=LOOPS, warmup=2).best
        out.append(Stream(k.name, k.code, k.reads, k.writes, (k.reads + k.writes) * 4 * n / seconds, 4 * n))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _measure(index: int) -> tuple[Stream, ...]:
    l2 = device_info(index).l2_bytes or 0
    with torch.cuda.device(index):
        free, _ = torch.cuda.mem_get_info(index)
        n = max(1 << 18, min(max(MIN_TENSOR_BYTES, 4 * l2), free // 8) // 4)  # float32 elements per tensor
        try:
            tensors = [torch.ones(n, device=index) for _ in range(4)]
        except torch.cuda.OutOfMemoryError:  # a GPU this full: no streaming figure, the DRAM peak stands in
            return ()
        return time_streams(tensors, cuda_event_timer(index))


def measure(device: Any) -> tuple[Stream, ...]:
    """The :data:`KERNELS` timed on a CUDA device (a ``torch.device`` or an index), once
    per process and device (none where the GPU has no memory left for their tensors)."""
    if not isinstance(device, int):
        device = torch.device(device)
        device = device.index if device.index is not None else torch.cuda.current_device()
    return _measure(device)
