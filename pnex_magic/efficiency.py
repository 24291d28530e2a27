"""How close a timed op is to the hardware's limit, and the likely reason when it is far.

:func:`assess` turns the timings (:class:`~pnex_magic.timing.TimingResult`) and the
device's ceilings (:class:`~pnex_magic.hardware.DeviceInfo`, the measured
device-to-device copy) into an :class:`Efficiency`: the op's and the eager
reference's bandwidth as fractions of the copy (the practical ceiling) and of the
DRAM peak.  When the op reaches less than :data:`FAR` of the ceiling,
:func:`reasons` names what the report's own facts point at, most likely first:
launch overhead (a tiny call), too few blocks for the SMs, register spills,
occupancy limited by registers or shared memory, inputs that are not contiguous
along the axis ``cuda.grid``'s x runs over, blocks narrower than a warp.

:func:`reasons` is a pure function of :class:`LaunchFacts` (plain numbers), so it
is tested with synthetic resource figures; :func:`strided_along_x` gathers the
stride facts from a call's arguments.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from .expressions import BinOp, Expr, MinMax, Neg, Numel, Size
from .hardware import DeviceInfo, occupancy_limiter
from .spec import KernelSpec, TensorParam
from .timing import TimingResult, format_bytes, format_time

__all__ = ["FAR", "LaunchFacts", "Efficiency", "reasons", "strided_along_x", "assess"]

#: Below this fraction of the ceiling, the report says why the op may be slow.
FAR = 0.6
#: A call this short is dominated by launch overhead, whatever the kernel does.
LAUNCH_BOUND_SECONDS = 8e-6


@dataclasses.dataclass(frozen=True)
class LaunchFacts:
    """What the report knows about one timed call (plain numbers)."""

    arch: str
    registers: int | None
    shared_bytes: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    block: tuple[int, int, int]
    grid: tuple[int, int, int]
    sm_count: int
    op_seconds: float
    bytes_moved: int
    #: input tensors not contiguous along the axis cuda.grid's x runs over: (name, stride in elements)
    strided: tuple[tuple[str, int], ...] = ()
    x_extent: int | None = None  #: n_threads[0] for the call


def reasons(f: LaunchFacts) -> tuple[str, ...]:
    """Every likely reason for a memory-bound kernel to be far from the bandwidth
    ceiling that the facts show, most likely first (empty when none shows)."""
    out: list[str] = []
    threads = math.prod(f.block)
    blocks = math.prod(f.grid)
    if f.op_seconds < LAUNCH_BOUND_SECONDS:
        out.append(
            f"launch overhead dominates: a call takes {format_time(f.op_seconds)} for {format_bytes(f.bytes_moved)}, "
            f"and a launch costs a few µs whatever it does; give each call more work, or capture calls in a "
            f"CUDA graph"
        )
    if blocks < f.sm_count:
        out.append(
            f"too few blocks to fill the GPU: {blocks:,} block(s) of {threads} threads for {f.sm_count} SMs; use "
            f"smaller blocks or more threads with less work each"
        )
    if f.spill_store_bytes or f.spill_load_bytes:
        out.append(
            f"register spills: {f.spill_store_bytes or 0} B stored and {f.spill_load_bytes or 0} B loaded per thread "
            f"through local memory; raise max_registers or keep fewer values live"
        )
    found = occupancy_limiter(f.arch, f.registers or 0, f.shared_bytes or 0, threads) if f.registers else None
    if found is not None and found[0] < 0.5:
        occ, limiter = found
        if limiter == "registers":
            out.append(
                f"occupancy {occ:.0%} limited by registers ({f.registers} per thread × {threads} threads per block); "
                f"cap them with max_registers or use smaller blocks"
            )
        elif limiter == "shared memory":
            out.append(
                f"occupancy {occ:.0%} limited by shared memory ({f.shared_bytes:,} B per block); use less per block"
            )
        elif limiter == "blocks":
            out.append(
                f"occupancy {occ:.0%} limited by the SM's block slots: blocks of {threads} threads are too small; "
                f"use at least 128 threads per block"
            )
    if f.strided:
        names = ", ".join(f"{name!r} (stride {stride})" for name, stride in f.strided)
        out.append(
            f"uncoalesced loads: {names} not contiguous along the axis cuda.grid's x runs over; pass contiguous "
            f"tensors (.contiguous()) or run x over their contiguous axis"
        )
    if f.block[0] < 32 and (f.x_extent or 0) >= 32:
        out.append(
            f"blocks narrower than a warp: X size {f.block[0]}, so each warp's loads span {32 // f.block[0]} rows; "
            f"use a block with X ≥ 32 (or threads_per_block='auto')"
        )
    return tuple(out)


def _x_size(expr: Expr) -> Size | Numel | None:
    """The first size the x extent is made of (``out.size(1) * 2`` → ``out.size(1)``)."""
    if isinstance(expr, (Size, Numel)):
        return expr
    children: tuple[Expr, ...] = ()
    if isinstance(expr, BinOp):
        children = (expr.left, expr.right)
    elif isinstance(expr, Neg):
        children = (expr.operand,)
    elif isinstance(expr, MinMax):
        children = expr.args
    for child in children:
        found = _x_size(child)
        if found is not None:
            return found
    return None


def strided_along_x(spec: KernelSpec, args: Sequence[Any]) -> tuple[tuple[str, int], ...]:
    """Input tensors (of the call's ``args``) that are not contiguous along the axis
    ``cuda.grid``'s x runs over, as read from ``n_threads[0]``: axis ``i`` of tensors of
    ``t``'s rank for ``t.size(i)``, the last axis for ``t.numel()``."""
    size = _x_size(spec.n_threads[0])
    if size is None:
        return ()
    ndim = spec.param(size.param).ndim
    axis = size.axis if isinstance(size, Size) else ndim - 1
    found = []
    for p, value in zip(spec.arguments, args):
        if not isinstance(p, TensorParam) or value.dim() != ndim or ndim == 0:
            continue
        if value.shape[axis] > 1 and value.stride(axis) != 1:
            found.append((p.name, int(value.stride(axis))))
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """Achieved bandwidth against the device's ceilings (bytes per second)."""

    op_bandwidth: float | None
    eager_bandwidth: float | None
    copy_bandwidth: float | None  #: measured device-to-device copy: the practical ceiling
    peak_bandwidth: float | None  #: DRAM peak from the memory clock and bus width
    peak_source: str
    device: str
    bytes_moved: int
    l2_bytes: int | None = None
    reasons: tuple[str, ...] = ()  #: why the op is far from the ceiling, most likely first

    @property
    def ceiling(self) -> float | None:
        return self.copy_bandwidth or self.peak_bandwidth

    @staticmethod
    def _fraction(value: float | None, limit: float | None) -> float | None:
        return None if value is None or not limit else value / limit

    @property
    def op_of_copy(self) -> float | None:
        return self._fraction(self.op_bandwidth, self.copy_bandwidth)

    @property
    def op_of_peak(self) -> float | None:
        return self._fraction(self.op_bandwidth, self.peak_bandwidth)

    @property
    def eager_of_copy(self) -> float | None:
        return self._fraction(self.eager_bandwidth, self.copy_bandwidth)

    @property
    def eager_of_peak(self) -> float | None:
        return self._fraction(self.eager_bandwidth, self.peak_bandwidth)

    @property
    def far(self) -> bool:
        """Whether the op reaches less than :data:`FAR` of the ceiling."""
        fraction = self._fraction(self.op_bandwidth, self.ceiling)
        return fraction is not None and fraction < FAR

    @property
    def in_l2(self) -> bool:
        """Whether the call's bytes fit in L2: back-to-back timed calls then hit the
        cache, and may exceed the DRAM ceilings."""
        return self.l2_bytes is not None and self.bytes_moved <= self.l2_bytes

    @property
    def reason(self) -> str | None:
        """One line: why the op is far from the ceiling (``None`` when it is not)."""
        if not self.far:
            return None
        if self.reasons:
            return self.reasons[0]
        return ("no launch limit shows in the figures: the kernel may be compute-bound, or read some bytes more "
                "than once (the bandwidth counts each argument and output byte once)")

    def describe(self, bandwidth: float | None) -> str:
        """``2.91 TB/s = 74% of the copy, 61% of peak``."""
        if bandwidth is None:
            return "n/a"
        parts = []
        if self.copy_bandwidth:
            parts.append(f"{bandwidth / self.copy_bandwidth:.0%} of the device-to-device copy")
        if self.peak_bandwidth:
            parts.append(f"{bandwidth / self.peak_bandwidth:.0%} of peak")
        return f"{bandwidth / 1e12:.3g} TB/s" + (" = " + ", ".join(parts) if parts else "")

    def lines(self) -> list[str]:
        ceilings = []
        if self.copy_bandwidth:
            ceilings.append(f"copy {self.copy_bandwidth / 1e12:.3g} TB/s (measured)")
        if self.peak_bandwidth:
            ceilings.append(f"peak {self.peak_bandwidth / 1e12:.3g} TB/s")
        out = [f"ceiling   : {', '.join(ceilings) or 'unknown'} on {self.device}",
               f"op        : {self.describe(self.op_bandwidth)}"]
        if self.eager_bandwidth is not None:
            out.append(f"eager     : {self.describe(self.eager_bandwidth)}")
        if self.in_l2:
            out.append(f"note      : {format_bytes(self.bytes_moved)} per call fits in L2 "
                       f"({format_bytes(self.l2_bytes)}): timed calls hit the cache")
        if self.reason:
            out.append(f"why       : {self.reason}")
        return out


def assess(
    timing: TimingResult, info: DeviceInfo, copy_bandwidth: float | None, facts: LaunchFacts | None
) -> Efficiency:
    """The :class:`Efficiency` of a timed op on a device (``facts``: for the reasons)."""
    return Efficiency(
        op_bandwidth=timing.bandwidth,
        eager_bandwidth=timing.eager_bandwidth,
        copy_bandwidth=copy_bandwidth,
        peak_bandwidth=info.peak_bandwidth,
        peak_source=info.peak_source,
        device=info.name,
        bytes_moved=timing.bytes_moved,
        l2_bytes=info.l2_bytes,
        reasons=reasons(facts) if facts is not None else (),
    )
