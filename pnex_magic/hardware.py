"""What the GPU allows and what it can do: per-SM limits, theoretical occupancy,
whether a block shape fits a kernel's resources and a call's grid, and the
memory-bandwidth ceilings of a device.

The limits and :func:`occupancy`, :func:`occupancy_limiter`,
:func:`resident_blocks`, :func:`block_problem` and :func:`dram_latency` are pure
functions of an architecture name and figures from ptxas (registers, shared
memory), so they are tested without a GPU.  The
device figures (:func:`device_info`) are read from the driver once per device:
SM count, L2 size, and the peak DRAM bandwidth from the memory clock and bus
width (``torch.cuda.get_device_properties``, else the driver's attributes through
``cuda.bindings``); :func:`copy_bandwidth` measures a device-to-device copy once
per process, the practical ceiling a memory-bound kernel can reach.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Sequence
from typing import Any

from .arch import parse_arch

__all__ = [
    "SM_LIMITS",
    "MAX_REGISTERS_PER_BLOCK",
    "MAX_GRID",
    "occupancy",
    "occupancy_limiter",
    "resident_blocks",
    "max_threads_per_sm",
    "block_problem",
    "DRAM_LATENCY",
    "dram_latency",
    "DeviceInfo",
    "device_info",
    "copy_bandwidth",
    "peak_bandwidth",
]

# Per-SM limits by compute capability major.minor (CUDA C Programming Guide, table
# "Technical Specifications per Compute Capability").
SM_LIMITS = {
    (7, 5): dict(threads=1024, blocks=16, regs=65536, smem=65536, warps=32),
    (8, 0): dict(threads=2048, blocks=32, regs=65536, smem=167936, warps=64),
    (8, 6): dict(threads=1536, blocks=16, regs=65536, smem=102400, warps=48),
    (8, 7): dict(threads=1536, blocks=16, regs=65536, smem=167936, warps=48),
    (8, 9): dict(threads=1536, blocks=24, regs=65536, smem=102400, warps=48),
    (9, 0): dict(threads=2048, blocks=32, regs=65536, smem=233472, warps=64),
    (10, 0): dict(threads=2048, blocks=32, regs=65536, smem=233472, warps=64),
    (12, 0): dict(threads=1536, blocks=32, regs=65536, smem=102400, warps=48),
}

#: Registers one block may use, on every architecture pnex targets.
MAX_REGISTERS_PER_BLOCK = 65536
#: Static shared memory one block may use.
MAX_STATIC_SHARED = 48 * 1024
#: Blocks per grid on the X, Y and Z axes.
MAX_GRID = (2**31 - 1, 65535, 65535)


def _limits(arch: str) -> dict[str, int] | None:
    cc = parse_arch(arch)
    return SM_LIMITS.get(cc) or SM_LIMITS.get((cc[0], 0))


def _registers_per_block(registers: int, threads_per_block: int) -> int:
    # Registers are allocated per warp in units of 256.
    warps = -(-threads_per_block // 32)
    return -(-max(registers, 1) * 32 // 256) * 256 * warps


def _blocks_by(limits: dict[str, int], registers: int, shared_bytes: int, threads_per_block: int) -> dict[str, int]:
    """Blocks of ``threads_per_block`` threads one SM holds, by each of its limits."""
    unused = limits["blocks"] + 1  # a resource the kernel does not use limits nothing
    return {
        "blocks": limits["blocks"],
        "threads": limits["threads"] // threads_per_block,
        "registers": limits["regs"] // _registers_per_block(registers, threads_per_block) if registers else unused,
        "shared memory": limits["smem"] // shared_bytes if shared_bytes else unused,
    }


def occupancy_limiter(
    arch: str, registers: int, shared_bytes: int, threads_per_block: int
) -> tuple[float, str] | None:
    """Theoretical occupancy (active warps / maximum warps per SM) for a block size,
    and what limits it: ``"registers"``, ``"shared memory"``, ``"threads"`` (the
    SM's thread slots) or ``"blocks"`` (the SM's block slots: blocks too small)."""
    limits = _limits(arch)
    if limits is None or threads_per_block <= 0:
        return None
    warps_per_block = -(-threads_per_block // 32)
    by = _blocks_by(limits, registers, shared_bytes, threads_per_block)
    # On a tie, name the kernel's own resource: that is the one the user can change.
    limiter = min(("registers", "shared memory", "threads", "blocks"), key=lambda k: by[k])
    return min(1.0, by[limiter] * warps_per_block / limits["warps"]), limiter


def resident_blocks(arch: str, registers: int, shared_bytes: int, threads_per_block: int) -> int | None:
    """How many blocks of ``threads_per_block`` threads one SM holds at once (0: not
    one fits), from the same limits as :func:`occupancy_limiter`."""
    limits = _limits(arch)
    if limits is None or threads_per_block <= 0:
        return None
    return min(_blocks_by(limits, registers, shared_bytes, threads_per_block).values())


def max_threads_per_sm(arch: str) -> int | None:
    """The most threads one SM of ``arch`` holds at once."""
    limits = _limits(arch)
    return None if limits is None else limits["threads"]


def occupancy(arch: str, registers: int, shared_bytes: int, threads_per_block: int) -> float | None:
    """Theoretical occupancy (active warps / maximum warps per SM) for a block size."""
    found = occupancy_limiter(arch, registers, shared_bytes, threads_per_block)
    return None if found is None else found[0]


def block_problem(
    arch: str,
    registers: int | None,
    shared_bytes: int | None,
    block: Sequence[int],
    n_threads: Sequence[int] | None = None,
) -> str | None:
    """Why ``block`` cannot launch this kernel (for a call launching ``n_threads``
    threads per axis), or ``None`` when it can.  ``registers`` and ``shared_bytes``
    are ptxas's figures (``None`` where unknown: those checks are skipped)."""
    threads = 1
    for size in block:
        threads *= size
    if registers:
        needed = _registers_per_block(registers, threads)
        if needed > MAX_REGISTERS_PER_BLOCK:
            return (
                f"needs {needed:,} registers per block ({registers} per thread × {threads} threads), above the "
                f"{MAX_REGISTERS_PER_BLOCK:,} a block may use"
            )
    if shared_bytes and shared_bytes > MAX_STATIC_SHARED:
        return f"uses {shared_bytes:,} B of static shared memory per block, above CUDA's {MAX_STATIC_SHARED:,} B"
    found = occupancy_limiter(arch, registers or 0, shared_bytes or 0, threads)
    if found is not None and found[0] <= 0:
        return f"not one block of {threads} threads fits on an SM of {arch} (limited by {found[1]})"
    for axis, n in enumerate(n_threads or ()):
        blocks = -(-int(n) // block[axis])
        if blocks > MAX_GRID[axis]:
            return (
                f"needs {blocks:,} blocks on axis {'XYZ'[axis]} for this call, above CUDA's {MAX_GRID[axis]:,}"
            )
    return None


# --------------------------------------------------------------------------- DRAM latency

# The time a load that misses every cache takes to return, per architecture, for
# Little's law (bytes in flight = bandwidth × latency) in the report's reasons
# (:mod:`pnex_magic.efficiency`).  These are *idle* latencies, from pointer chasing
# (one warp, each load's address read by the previous load), in SM clock cycles at
# the clock the benchmark ran at, converted here to seconds.  Under full load the
# latency is higher (requests queue), so the bytes in flight computed from these
# figures are the least a kernel needs to reach the bandwidth ceiling: a kernel
# below them cannot reach it, one above them may still fall short.
#
# Sources (read 2026):
# - RRZE-HPC/gpu-benches, gpu-latency/*.txt (the benchmark prints the measured SM
#   clock and the cycles per load for buffers up to 2.2 GB; the last row is DRAM):
#   V100 PCIe 434 cycles at 1380 MHz; A100 80 GB 552 at 1410 MHz; A40 557 at
#   1740 MHz; L40 625 at 2490 MHz; GH200 689 at 1980 MHz.
# - markdewing/AI_kernels, latency/README.md (pointer chasing, clocks not locked):
#   V100 460 cycles, A100 SXM 550, RTX 4090 636, H100 SXM 700, GH200 690, B200 860,
#   RTX 5090 936; seconds here at the card's boost clock (B200 1965 MHz, RTX 5090
#   2407 MHz), the clock an unlocked benchmark runs at.
# - Turing: no measured figure for a Turing GPU was at hand.  Jia et al.,
#   "Dissecting the NVidia Turing T4 GPU via Microbenchmarking" (arXiv:1903.07486,
#   2019) find that TU104 has the memory hierarchy depth of Volta's GV100, so
#   Volta's figure stands in for sm_75.
#: (seconds, where the figure comes from) per compute capability.
DRAM_LATENCY: dict[tuple[int, int], tuple[float, str]] = {
    (7, 0): (434 / 1380e6, "V100: 434 cycles at 1380 MHz (RRZE-HPC gpu-benches, pointer chasing)"),
    (7, 5): (434 / 1380e6, "Volta's V100 figure (434 cycles at 1380 MHz, RRZE-HPC gpu-benches): no Turing "
                           "measurement at hand, and Turing's memory hierarchy is as deep as Volta's (Jia et al. 2019)"),
    (8, 0): (552 / 1410e6, "A100 80 GB: 552 cycles at 1410 MHz (RRZE-HPC gpu-benches, pointer chasing)"),
    (8, 6): (557 / 1740e6, "A40: 557 cycles at 1740 MHz (RRZE-HPC gpu-benches, pointer chasing)"),
    (8, 9): (625 / 2490e6, "L40: 625 cycles at 2490 MHz (RRZE-HPC gpu-benches, pointer chasing)"),
    (9, 0): (689 / 1980e6, "GH200: 689 cycles at 1980 MHz (RRZE-HPC gpu-benches, pointer chasing; H100 SXM: "
                           "700 cycles, markdewing/AI_kernels)"),
    (10, 0): (860 / 1965e6, "B200: 860 cycles (markdewing/AI_kernels, pointer chasing) at its 1965 MHz boost clock"),
    (12, 0): (936 / 2407e6, "RTX 5090: 936 cycles (markdewing/AI_kernels, pointer chasing) at its 2407 MHz boost "
                            "clock"),
}


def dram_latency(arch: str) -> tuple[float, str] | None:
    """The idle DRAM latency of ``arch`` in seconds and where the figure comes from
    (:data:`DRAM_LATENCY`; another minor version of the same major stands in), or
    ``None`` for an architecture without one."""
    cc = parse_arch(arch)
    return DRAM_LATENCY.get(cc) or DRAM_LATENCY.get((cc[0], 0))


# --------------------------------------------------------------------------- devices


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """Figures of one GPU that say how fast a kernel can be."""

    name: str
    arch: str
    sm_count: int
    l2_bytes: int | None
    peak_bandwidth: float | None  #: bytes per second, from the memory clock and bus width
    peak_source: str  #: how the peak was obtained, or why it is unknown


def peak_bandwidth(memory_clock_khz: int | None, bus_width_bits: int | None) -> float | None:
    """Peak DRAM bandwidth in bytes per second: two transfers per memory clock (DDR;
    the driver reports HBM and GDDR clocks so that this holds) times the bus width."""
    if not memory_clock_khz or not bus_width_bits:
        return None
    return 2.0 * memory_clock_khz * 1e3 * bus_width_bits / 8


def _driver_attributes(index: int) -> tuple[int | None, int | None]:
    """Memory clock (kHz) and bus width (bits) from the driver, through ``cuda.bindings``."""
    try:
        from cuda.bindings import driver

        attrs = driver.CUdevice_attribute
        err, dev = driver.cuDeviceGet(index)
        values = []
        for attr in (attrs.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, attrs.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH):
            err, value = driver.cuDeviceGetAttribute(attr, dev)
            values.append(int(value) if err == driver.CUresult.CUDA_SUCCESS else None)
        return values[0], values[1]
    except Exception:
        return None, None


@functools.lru_cache(maxsize=None)
def _device_info(index: int) -> DeviceInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    clock = getattr(props, "memory_clock_rate", None)
    width = getattr(props, "memory_bus_width", None)
    source = "torch.cuda.get_device_properties"
    if not clock or not width:
        clock, width = _driver_attributes(index)
        source = "the driver's device attributes"
    peak = peak_bandwidth(clock, width)
    if peak is not None:
        source = f"memory clock {clock / 1e3:.0f} MHz × {width}-bit bus × 2 (DDR), from {source}"
    else:
        source = "unknown: neither torch nor the driver reported the memory clock and bus width"
    return DeviceInfo(
        name=props.name,
        arch=f"sm_{props.major}{props.minor}",
        sm_count=int(props.multi_processor_count),
        l2_bytes=getattr(props, "L2_cache_size", None),
        peak_bandwidth=peak,
        peak_source=source,
    )


def _index(device: Any) -> int:
    import torch

    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def device_info(device: Any) -> DeviceInfo:
    """:class:`DeviceInfo` of a CUDA device (a ``torch.device``, or an index), read once."""
    return _device_info(_index(device))


@functools.lru_cache(maxsize=None)
def _copy_bandwidth(index: int, nbytes: int) -> float:
    import torch

    with torch.cuda.device(index):
        free, _ = torch.cuda.mem_get_info(index)
        n = max(1 << 20, min(nbytes, free // 4))
        src = torch.empty(n, dtype=torch.uint8, device=index)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        times = []
        for _ in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        del src, dst
    return 2 * n / statistics.median(times)  # every byte read once and written once


def copy_bandwidth(device: Any, nbytes: int = 256 << 20) -> float:
    """Bytes per second of a device-to-device copy of ``nbytes`` (bytes read plus bytes
    written, per second), measured once per process and device: the practical ceiling
    of a memory-bound kernel (the size exceeds every L2, so the copy runs from DRAM)."""
    return _copy_bandwidth(_index(device), nbytes)
