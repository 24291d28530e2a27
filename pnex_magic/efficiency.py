"""How close a timed op is to the hardware's limit, and the likely reason when it is far.

:func:`assess` turns the timings (:class:`~pnex_magic.timing.TimingResult`) and the
device's ceilings (:class:`~pnex_magic.hardware.DeviceInfo`, the streaming kernels
:mod:`pnex_magic.ceiling` measures) into an :class:`Efficiency`: the op's and the eager
reference's bandwidth as fractions of the ceiling and of the DRAM peak.  The ceiling is
the fastest rate measured for the call: torch's streaming kernels at its mix of reads
and writes, or a reference timed on the call's bytes (``--eager``, or one passed to
:meth:`Efficiency.against`) where faster, so no figure the report shows beats it.  The
verdict says "at the ceiling" from :data:`AT_CEILING` of it, "near it, not at it" from
:data:`FAR`.  When the op reaches less than :data:`FAR` of the ceiling, the report
names what its own facts point at (:func:`reasons`, most likely first), each a
:class:`Reason`: what the figures show, what to change, and the shape of the code
where that helps:

* ``"launch"``: a tiny call, dominated by launch overhead;
* ``"blocks"``: fewer blocks than SMs;
* ``"uncoalesced"``: inputs not contiguous along the axis ``cuda.grid``'s x runs over;
* ``"block rate"``: blocks of so little work that the SMs start them as fast as
  they can (measured where :func:`~pnex_magic.hardware.block_start` has a figure);
* ``"in flight"``: too few bytes in flight per SM for the memory's latency under load
  (:func:`~pnex_magic.hardware.in_flight_share`), fixed by more independent elements
  per thread with ``pnex.Tune`` in the block-strided form;
* ``"wave"``: a partial last wave of blocks that leaves much of the GPU idle;
* ``"occupancy"``: occupancy limited by registers, shared memory or block slots;
* ``"spills"``: register spills to local memory;
* ``"narrow"``: blocks so narrow along x that a warp uses part of each 32-byte sector it reads;
* ``"unexplained"`` (:data:`UNEXPLAINED`): far from the ceiling, and none of the above shows.

:func:`reasons` is a pure function of :class:`LaunchFacts` (plain numbers), so each
reason is tested with recorded figures (:mod:`pnex_magic.profiles` has those of several
GPUs); :mod:`pnex_magic.callfacts` gathers facts from a call's arguments.  A call whose
bytes fit in L2 is not judged: its timed calls may be served from the cache.
"""

from __future__ import annotations

import dataclasses
import math

from .callfacts import element_bytes, input_bytes, read_share, strided_along_x
from .ceiling import MemoryCeiling
from .hardware import (
    IN_FLIGHT_TARGET, DeviceInfo, block_start, in_flight_needed, in_flight_share, loaded_latency, max_threads_per_sm,
    occupancy_limiter, resident_blocks,
)
from .timing import TimingResult, format_bytes, format_rate, format_time, rate_unit
from .tune_template import TUNE_SHAPE

__all__ = [
    "FAR", "AT_CEILING", "LaunchFacts", "Reason", "InFlight", "in_flight", "Efficiency", "reasons", "strided_along_x",
    "input_bytes", "element_bytes", "read_share", "assess", "TUNE_SHAPE", "UNEXPLAINED", "share_text", "GRAPH_GAIN",
]

#: Below this fraction of the ceiling, the report says why the op may be slow.
FAR = 0.85
#: From this fraction of the ceiling on, the op is at it: two measurements of one streaming kernel
#: in separate processes on one GPU differ by up to 4% (a copy: 2.77 to 2.89 TB/s in the notebooks'
#: H100 run), so within 5% the op cannot be told from the ceiling.  Between FAR and this, it is near
#: the ceiling, not at it: the ceiling's kernel is 1.05× to 1.18× as fast.
AT_CEILING = 0.95
#: A call this short is dominated by launch overhead, whatever the kernel does.
LAUNCH_BOUND_SECONDS = 8e-6
#: A partial last wave is named when it leaves at least this share of the SMs' time idle.
IDLE_WAVE_SHARE = 0.15
#: A kernel counts as memory-bound when it reaches at least this share of what its bytes in
#: flight allow (below it, something else binds first and more bytes in flight would not help).
MEMORY_BOUND_SHARE = 0.5
#: The bytes-in-flight reason is given only while the op stays under what its bytes in flight
#: allow, with this slack for the model's roughness (above it, the model does not fit the kernel).
IN_FLIGHT_SLACK = 1.1
#: Too few bytes in flight are named as the limit only where they allow less than this share
#: of the ceiling: above it, they could not keep the op below FAR by themselves.
IN_FLIGHT_LIMIT = 0.9
#: Blocks are named as the limit when the SMs start them at least this close to the fastest
#: they can (:func:`~pnex_magic.hardware.block_start`).
BLOCK_RATE_SHARE = 0.85
#: Bytes of one DRAM sector: a warp that uses less of each sector it reads wastes bandwidth.
SECTOR_BYTES = 32



@dataclasses.dataclass(frozen=True)
class LaunchFacts:
    """What the report knows about one timed call (plain numbers)."""

    arch: str
    registers: int | None
    shared_bytes: int | None  #: per block, static plus dynamic (shared_bytes=)
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
    input_bytes: int | None = None  #: bytes of the call's input tensors (In and InMut): what the threads read
    #: bytes per second: the memory ceiling at the call's mix (:mod:`pnex_magic.ceiling`), else the DRAM peak
    ceiling_bandwidth: float | None = None
    latency: float | None = None  #: seconds (None: :func:`~pnex_magic.hardware.loaded_latency` of arch)
    tune: tuple[tuple[str, object], ...] = ()  #: the Tune values the call ran with, e.g. (("ITEMS", 4),)
    element_bytes: int | None = None  #: bytes of one element of the inputs x runs over (None: 4)
    #: the kernel rewritten with more elements per thread (:func:`~pnex_magic.tune_template.tune_template`);
    #: "" for the generic shape, :data:`TUNE_SHAPE`
    template: str = ""
    #: seconds per call of the op replayed in a CUDA graph (measured for a launch-bound call; None: not measured)
    graph_seconds: float | None = None

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    @property
    def share(self) -> float:
        """The op's bandwidth as a share of the ceiling (0 where unknown)."""
        if not self.ceiling_bandwidth or self.op_seconds <= 0:
            return 0.0
        return self.bytes_moved / self.op_seconds / self.ceiling_bandwidth

    @property
    def memory_latency(self) -> float | None:
        """The latency of the bytes-in-flight model (seconds): :attr:`latency`, else the
        architecture's (:func:`~pnex_magic.hardware.loaded_latency`)."""
        return self.latency if self.latency is not None else loaded_latency(self.arch)


@dataclasses.dataclass(frozen=True)
class Reason:
    """One likely limiter of a timed op: what the figures show and what to change."""

    kind: str  #: "launch", "blocks", "uncoalesced", "block rate", "in flight", "wave", "occupancy", "spills", "narrow"
    finding: str  #: what the report's figures show
    advice: str  #: what to change
    code: str = ""  #: the shape of the code the advice asks for, where that helps

    def __str__(self) -> str:
        return f"{self.finding}; {self.advice}"

    @property
    def headline(self) -> str:
        """The finding's first clause: ``too few bytes in flight``."""
        return self.finding.split(":", 1)[0]


@dataclasses.dataclass(frozen=True)
class InFlight:
    """The bytes-in-flight model for one call (:func:`~pnex_magic.hardware.in_flight_share`)."""

    have: float  #: bytes of loads each SM keeps in flight
    knee: float  #: read bandwidth per SM at the ceiling × latency (bytes)
    per_thread: float  #: bytes each thread reads (all in flight at once, loads first)
    threads: int  #: threads resident on each SM
    grid_capped: bool  #: the grid gives each SM fewer threads than fit (the whole call is in flight)

    @property
    def share(self) -> float:
        """The share of the ceiling these bytes in flight allow."""
        return in_flight_share(self.have, self.knee)

    @property
    def needed(self) -> float:
        """Bytes per SM in flight that reach :data:`~pnex_magic.hardware.IN_FLIGHT_TARGET` of the ceiling."""
        return in_flight_needed(self.knee)


def in_flight(f: LaunchFacts) -> InFlight | None:
    """The bytes-in-flight model of a call (``None`` where a figure is missing): the
    bytes each SM keeps in flight against the read bandwidth per SM × latency."""
    latency = f.memory_latency
    launched = f.blocks * f.threads_per_block
    max_threads = max_threads_per_sm(f.arch)
    if not (f.ceiling_bandwidth and latency and f.input_bytes and launched and max_threads and f.sm_count):
        return None
    found = occupancy_limiter(f.arch, f.registers or 0, f.shared_bytes or 0, f.threads_per_block)
    occ = found[0] if found is not None else 1.0
    resident = int(occ * max_threads)
    from_grid = -(-launched // f.sm_count)  # the threads the grid gives each SM
    per_thread = f.input_bytes / launched  # one element per thread: only that element's bytes wait at once
    threads = min(resident, from_grid)
    read_share = min(1.0, f.input_bytes / f.bytes_moved) if f.bytes_moved else 1.0
    knee = f.ceiling_bandwidth * read_share / f.sm_count * latency
    return InFlight(threads * per_thread, knee, per_thread, threads, from_grid < resident)


#: CUDA graphs are advised for a launch-bound call only where a replay measured at most this share of a call.
GRAPH_GAIN = 0.75


def _launch_advice(f: LaunchFacts) -> str:
    """What to do about a launch-bound call, from what was measured: CUDA graphs only
    where a graph's replay of the call measured faster than a call."""
    more = "give each call more work (batch several calls into one)"
    g = f.graph_seconds
    if g is None:
        return f"a launch costs a few µs whatever the kernel does: {more}"
    if g <= GRAPH_GAIN * f.op_seconds:
        return (f"replayed in a CUDA graph, a call took {format_time(g)} (measured here): capture the calls in a CUDA "
                f"graph (torch.cuda.graph, or torch.compile(mode='reduce-overhead')), or {more}")
    return (f"replayed in a CUDA graph, a call took {format_time(g)} (measured here), no faster: a graph would not "
            f"help; {more}")


def _tuned(f: LaunchFacts) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in f.tune)


def reasons(f: LaunchFacts) -> tuple[Reason, ...]:
    """Every likely reason for a memory-bound kernel to be far from the bandwidth
    ceiling that the facts show, most likely first (empty when none shows).

    A launch-bound call and a grid with fewer blocks than SMs come first: where they
    show, nothing inside the kernel can help.  Uncoalesced inputs come before too few
    bytes in flight, since more elements per thread do not mend wasted transactions,
    and blocks started as fast as the SMs can come before them too (more bytes in
    flight per block would not start blocks any faster).
    """
    out: list[Reason] = []
    threads = f.threads_per_block
    blocks = f.blocks
    share = f.share
    # A call whose bytes take far less than a launch at the ceiling's bandwidth is launch-bound
    # however long it measured (a busy host stretches the time between launches too).
    floor = f.bytes_moved / f.ceiling_bandwidth if f.ceiling_bandwidth else None
    tiny = f.op_seconds < LAUNCH_BOUND_SECONDS or (floor is not None and floor < 0.5e-6
                                                    and f.op_seconds < 4 * LAUNCH_BOUND_SECONDS)
    if tiny:
        out.append(Reason(
            "launch",
            f"launch overhead dominates: a call takes {format_time(f.op_seconds)} for {format_bytes(f.bytes_moved)}",
            _launch_advice(f),
        ))
    few_blocks = blocks < f.sm_count
    if few_blocks:
        out.append(Reason(
            "blocks",
            f"too few blocks to fill the GPU: {blocks:,} block(s) of {threads} threads for {f.sm_count} SMs",
            "use smaller blocks, or more threads with less work each",
        ))
    if f.strided:
        names = ", ".join(f"{name!r} (stride {stride})" for name, stride in f.strided)
        out.append(Reason(
            "uncoalesced",
            f"uncoalesced loads: {names} not contiguous along the axis cuda.grid's x runs over",
            "pass contiguous tensors (.contiguous()) or run x over their contiguous axis",
        ))
    how = ("block-strided (j = base + k * cuda.blockDim.x) so that a warp still reads 32 neighbours, and load them all "
           "before storing; never j = i * ITEMS + k, which makes every load uncoalesced")
    if f.block[1] > 1 or f.grid[1] > 1:  # a 2-D launch: more rows per thread, x still along a row
        how = ("rows block-strided (y = base + k * cuda.blockDim.y) so that a warp still reads 32 neighbours of a row, "
               "and load them all before storing")
    tuned = _tuned(f)
    more_items = (f"it ran with {tuned}: offer more elements per thread among the Tune choices, {how}" if tuned
                  else f"give each thread several independent elements with pnex.Tune, {how}")
    start = block_start(f.arch)
    if start and blocks and f.op_seconds > 0 and not (tiny or few_blocks):
        interval = f.op_seconds * f.sm_count / blocks  # between two block starts on one SM
        if start / interval >= BLOCK_RATE_SHARE:
            out.append(Reason(
                "block rate",
                f"blocks of little work: {blocks:,} blocks of {threads} threads, "
                f"{format_bytes(f.bytes_moved / blocks)} each, in {format_time(f.op_seconds)}: each SM starts one "
                f"every {interval * 1e9:.0f} ns, about as fast as an SM of this GPU can (one every {start * 1e9:.0f} ns)",
                f"give each block more work: {more_items}; or use larger blocks (threads_per_block='auto')",
                f.template or TUNE_SHAPE,
            ))
    flight = in_flight(f)
    memory_bound = False
    if flight is not None:
        bound = flight.share
        # The op's share of the ceiling against what its bytes in flight allow: well below it,
        # something else binds first (compute, say); above it, the model does not fit this
        # kernel (its read pattern is a guess) and says nothing.
        memory_bound = share >= MEMORY_BOUND_SHARE * bound
        explains = bound < IN_FLIGHT_LIMIT and share <= IN_FLIGHT_SLACK * bound
        allows = (f"enough for about {bound:.0%} of the ceiling on this GPU, where about "
                  f"{format_bytes(flight.needed)} per SM would reach {IN_FLIGHT_TARGET:.0%}")
        if explains and memory_bound and not flight.grid_capped:
            out.append(Reason(
                "in flight",
                f"too few bytes in flight: each SM keeps about {format_bytes(flight.have)} of loads in flight "
                f"({flight.threads:,} resident threads × {flight.per_thread:.3g} B read per thread), {allows}",
                more_items,
                f.template or TUNE_SHAPE,
            ))
        elif explains and flight.grid_capped and not (tiny or few_blocks):
            # The whole input is in flight at once: a bound on any kernel, memory-bound or not.
            out.append(Reason(
                "in flight",
                f"too few bytes in flight: the whole call reads about {format_bytes(flight.have)} per SM, {allows}: "
                f"the call is too small to reach the ceiling, whatever the kernel",
                "give each call more work (batch several calls into one)",
            ))
    per_sm = resident_blocks(f.arch, f.registers or 0, f.shared_bytes or 0, threads)
    if per_sm and not few_blocks:
        wave = per_sm * f.sm_count
        waves = blocks / wave
        full = math.ceil(waves)
        idle = (full - waves) / full
        tail = waves - math.floor(waves)
        # A memory-bound kernel's last wave starves only if its blocks alone keep too few
        # bytes in flight; any other kernel's last wave leaves the idle SMs' time unused.
        starved = not memory_bound or flight is None or in_flight_share(tail * flight.have, flight.knee) < FAR
        if waves >= 1 and idle >= IDLE_WAVE_SHARE and starved:
            out.append(Reason(
                "wave",
                f"a partial last wave: {blocks:,} blocks are {waves:.2f} waves of {wave:,} ({per_sm} resident blocks "
                f"of {threads} threads per SM × {f.sm_count} SMs), so the last wave runs {tail:.0%} full and about "
                f"{idle:.0%} of the SMs' time is idle",
                "make the grid end near a whole wave, or span many: change the elements per thread (a pnex.Tune "
                "parameter) or the block size (threads_per_block='auto')",
            ))
    found = occupancy_limiter(f.arch, f.registers or 0, f.shared_bytes or 0, threads) if f.registers else None
    if found is not None and found[0] < 0.5:
        occ, limiter = found
        if limiter == "registers":
            out.append(Reason(
                "occupancy",
                f"occupancy {occ:.0%} limited by registers ({f.registers} per thread × {threads} threads per block)",
                "cap them with max_registers or use smaller blocks",
            ))
        elif limiter == "shared memory":
            out.append(Reason(
                "occupancy",
                f"occupancy {occ:.0%} limited by shared memory ({f.shared_bytes:,} B per block)",
                "use less per block",
            ))
        elif limiter == "blocks":
            out.append(Reason(
                "occupancy",
                f"occupancy {occ:.0%} limited by the SM's block slots: blocks of {threads} threads are too small",
                "use at least 128 threads per block",
            ))
    if f.spill_store_bytes or f.spill_load_bytes:
        out.append(Reason(
            "spills",
            f"register spills: {f.spill_store_bytes or 0} B stored and {f.spill_load_bytes or 0} B loaded per thread "
            f"through local memory",
            "raise max_registers or keep fewer values live",
        ))
    row = f.block[0] * (f.element_bytes or 4)  # bytes a warp reads of each row it touches
    if row < SECTOR_BYTES and (f.x_extent or 0) >= 32:
        wide = -(-SECTOR_BYTES // (f.element_bytes or 4))
        out.append(Reason(
            "narrow",
            f"blocks too narrow along x: X size {f.block[0]}, so a warp reads {row} B from each of "
            f"{32 // f.block[0]} rows, while memory delivers whole {SECTOR_BYTES}-byte sectors",
            f"use a block whose X covers at least {SECTOR_BYTES} B of a row (X ≥ {wide} here), or "
            f"threads_per_block='auto'",
        ))
    return tuple(out)


def share_text(fraction: float) -> str:
    """``73%``; ``<1%`` for a share that would round to 0%."""
    return f"{fraction:.0%}" if fraction >= 0.005 else "<1%"


#: What the report says when the op is far from the ceiling and no reason shows.
UNEXPLAINED = Reason(
    "unexplained",
    "no cause shows in the figures the report checks",
    "run the cell again with --profile (in a script: pnex.profile(op, *args)) to measure what holds it back",
)


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """Achieved bandwidth against the device's ceilings (bytes per second)."""

    op_bandwidth: float | None
    eager_bandwidth: float | None
    copy_bandwidth: float | None  #: a device-to-device copy, measured: the ceiling where no streaming figure is
    peak_bandwidth: float | None  #: DRAM peak from the memory clock and bus width
    peak_source: str
    device: str
    bytes_moved: int
    l2_bytes: int | None = None
    reasons: tuple[Reason, ...] = ()  #: why the op is far from the ceiling, most likely first
    facts: LaunchFacts | None = dataclasses.field(default=None, compare=False)  #: what the reasons were read from
    memory: MemoryCeiling | None = None  #: torch's streaming kernels at the call's mix (:mod:`pnex_magic.ceiling`)
    #: other rates measured on the call's bytes (name, bytes per second), :meth:`against`
    references: tuple[tuple[str, float], ...] = ()

    @property
    def memory_ceiling(self) -> float | None:
        """What the memory allows this call: the streaming kernels at its mix, else the
        copy, else the DRAM peak (bytes per second)."""
        return self.memory.bandwidth if self.memory is not None else self.copy_bandwidth or self.peak_bandwidth

    def _top(self) -> tuple[float, str] | None:
        """The fastest rate measured for this call, with what reached it (``None``: no ceiling known)."""
        memory = self.memory_ceiling
        if not memory:
            return None
        name = (self.memory.short if self.memory is not None else
                "the device-to-device copy" if self.copy_bandwidth else "the DRAM peak")
        found = [(memory, name), *((rate, f"{ref}, on this call's bytes") for ref, rate in self.references if rate)]
        if self.eager_bandwidth:
            found.append((self.eager_bandwidth, "the eager reference, on this call's bytes"))
        return max(found, key=lambda c: c[0])

    @property
    def ceiling(self) -> float | None:
        """The fastest rate measured for this call: :attr:`memory_ceiling`, or a reference
        timed on its bytes where faster (``None``: no ceiling known)."""
        top = self._top()
        return top[0] if top else None

    @property
    def ceiling_by(self) -> str:
        """What reached the ceiling: ``torch's add at this call's mix``."""
        top = self._top()
        return top[1] if top else "nothing measured"

    def against(self, name: str, bandwidth: float) -> Efficiency:
        """This result with one more reference timed on the call's bytes (``bandwidth``:
        the call's bytes over its time): where faster, it is the ceiling."""
        return dataclasses.replace(self, references=(*self.references, (name, bandwidth)))

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
    def op_of_ceiling(self) -> float | None:
        """The op's bandwidth as a share of the ceiling."""
        return self._fraction(self.op_bandwidth, self.ceiling)

    @property
    def in_l2(self) -> bool:
        """Whether the call's bytes fit in L2: back-to-back timed calls then may be served
        from the cache, and the DRAM ceilings do not apply to them."""
        return self.l2_bytes is not None and self.bytes_moved <= self.l2_bytes

    @property
    def launch_bound(self) -> bool:
        """Whether launch overhead dominates the call: then it is far from any ceiling,
        DRAM's or L2's, whatever the kernel does."""
        return bool(self.reasons) and self.reasons[0].kind == "launch"

    @property
    def judged(self) -> bool:
        """Whether the DRAM ceilings apply to the call: it does not fit in L2, or it is
        launch-bound (too short for the cache to matter)."""
        return not self.in_l2 or self.launch_bound

    def _judged_fraction(self) -> float | None:
        fraction = self.op_of_ceiling
        return fraction if fraction is not None and self.judged else None

    @property
    def far(self) -> bool:
        """Whether the op reaches less than :data:`FAR` of the ceiling, on a call the
        DRAM ceilings apply to (:attr:`judged`)."""
        fraction = self._judged_fraction()
        return fraction is not None and fraction < FAR

    @property
    def near(self) -> bool:
        """Whether the op reaches :data:`FAR` of the ceiling, not :data:`AT_CEILING`:
        close, while the ceiling's kernel is still measurably faster."""
        fraction = self._judged_fraction()
        return fraction is not None and FAR <= fraction < AT_CEILING

    @property
    def at_ceiling(self) -> bool:
        """Whether the op reaches :data:`AT_CEILING` of the ceiling or more, on a call the
        DRAM ceilings apply to: a success, shown as one."""
        fraction = self._judged_fraction()
        return fraction is not None and fraction >= AT_CEILING

    @property
    def explanation(self) -> Reason | None:
        """Why the op is far from the ceiling (``None`` when it is not): the most likely
        :class:`Reason`, or :data:`UNEXPLAINED` when the figures show none."""
        if not self.far:
            return None
        return self.reasons[0] if self.reasons else UNEXPLAINED

    @property
    def reason(self) -> str | None:
        """One line: why the op is far from the ceiling and what to change (``None`` when
        it is not far)."""
        found = self.explanation
        return None if found is None else str(found)

    @property
    def also(self) -> tuple[Reason, ...]:
        """The other reasons the figures show, when the op is far from the ceiling."""
        return self.reasons[1:] if self.far else ()

    @property
    def unit(self) -> tuple[float, str]:
        """One unit for every rate of this report (:func:`~pnex_magic.timing.rate_unit`)."""
        return rate_unit(self.op_bandwidth, self.eager_bandwidth, self.copy_bandwidth, self.peak_bandwidth,
                         self.ceiling)

    def rate(self, bandwidth: float) -> str:
        """``2.91 TB/s`` in :attr:`unit`."""
        return format_rate(bandwidth, self.unit)

    def describe(self, bandwidth: float | None) -> str:
        """``2.91 TB/s = 74% of the ceiling, 61% of peak``."""
        if bandwidth is None:
            return "n/a"
        parts = []
        if self.ceiling:
            parts.append(f"{share_text(bandwidth / self.ceiling)} of the ceiling")
        if self.peak_bandwidth:
            parts.append(f"{share_text(bandwidth / self.peak_bandwidth)} of peak")
        return self.rate(bandwidth) + (" = " + ", ".join(parts) if parts else "")

    @property
    def verdict(self) -> str:
        """One line on the op against the ceiling: at it, near it, below it (the ceiling's
        rate and what reached it named), or why it is not judged."""
        if not self.judged:
            return (f"not judged: the call's {format_bytes(self.bytes_moved)} fit in the GPU's "
                    f"{format_bytes(self.l2_bytes)} L2, so back-to-back timed calls may be served from the cache and "
                    f"the DRAM ceilings do not apply; time it on inputs larger than L2 to compare it with them")
        fraction = self.op_of_ceiling
        if fraction is None:
            return "not judged: no ceiling known for this device"
        head = f"{share_text(fraction)} of the ceiling ({self.rate(self.ceiling)}, {self.ceiling_by})"
        if fraction > 1:
            return f"{head}: at the ceiling, faster than every rate measured for this call"
        if fraction >= AT_CEILING:
            return f"{head}: at the ceiling"
        if fraction >= FAR:
            return f"{head}: near it, not at it: the ceiling is {1 / fraction:.2f}× the op's rate"
        return f"{head}: below {FAR:.0%} of it"

    def lines(self) -> list[str]:
        ceiling = self.ceiling
        out = [f"ceiling   : {self.rate(ceiling)}, {self.ceiling_by}, on {self.device}" if ceiling
               else f"ceiling   : unknown on {self.device}"]
        measured = ([self.memory.listing(self.unit)] if self.memory is not None else
                    [f"copy {self.rate(self.copy_bandwidth)} (measured)"] if self.copy_bandwidth else [])
        measured += [f"peak {self.rate(self.peak_bandwidth)}"] if self.peak_bandwidth else []
        if measured:
            out.append(f"memory    : {'; '.join(measured)}")
        out.append(f"op        : {self.describe(self.op_bandwidth)}")
        if self.eager_bandwidth is not None:
            out.append(f"eager     : {self.describe(self.eager_bandwidth)}")
        out += [f"{name[:10]:<10}: {self.describe(rate)}" for name, rate in self.references]
        if not self.far:
            out.append(f"verdict   : {self.verdict}")
        found = self.explanation
        if found is not None:
            out.append(f"why       : below {FAR:.0%} of the ceiling: {found.finding}")
            out.append(f"change    : {found.advice}")
            if found.code:
                out += ["            " + line for line in found.code.splitlines()]
            out += [f"also      : {r}" for r in self.also]
        return out


def assess(
    timing: TimingResult, info: DeviceInfo, copy_bandwidth: float | None, facts: LaunchFacts | None,
    memory: MemoryCeiling | None = None,
) -> Efficiency:
    """The :class:`Efficiency` of a timed op on a device (``facts``: for the reasons;
    ``memory``: the streaming kernels' ceiling at the call's mix)."""
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
        facts=facts,
        memory=memory,
    )
