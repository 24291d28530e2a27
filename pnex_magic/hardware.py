"""What the GPU allows and what it can do: per-SM limits, theoretical occupancy,
whether a block shape fits a kernel's resources and a call's grid, and the
memory-bandwidth and compute peaks of a device.

The limits and :func:`occupancy`, :func:`occupancy_limiter`,
:func:`resident_blocks`, :func:`block_problem`, the bytes-in-flight model
(:func:`in_flight_share`, :func:`loaded_latency`) and :func:`block_start` are pure
functions of an architecture name and recorded figures, so they are tested without
a GPU.  The
device figures (:func:`device_info`) are read from the driver once per device:
SM count, L2 size, and the peak DRAM bandwidth from the memory clock and bus
width (``torch.cuda.get_device_properties``, else the driver's attributes through
``cuda.bindings``).  The practical ceiling a memory-bound kernel can reach, measured
once per process, is :mod:`pnex_magic.ceiling`'s.
"""

from __future__ import annotations

import dataclasses
import functools
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
    "max_shared_per_block",
    "MAX_SHARED_PER_BLOCK",
    "block_problem",
    "LOADED_LATENCY",
    "loaded_latency",
    "IN_FLIGHT_TARGET",
    "in_flight_share",
    "in_flight_needed",
    "BLOCK_START",
    "block_start",
    "DeviceInfo",
    "device_info",
    "peak_bandwidth",
    "FLOPS_PER_CLOCK",
    "PEAK_KINDS",
    "PeakFlops",
    "peak_flops",
]

# Per-SM limits by compute capability major.minor (CUDA C Programming Guide, table
# "Technical Specifications per Compute Capability"): ``smem`` is the shared memory of
# one SM, ``smem_block`` the most one block may use (static plus dynamic, the opt-in
# maximum, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), ``reserved`` what
# the system keeps per resident block that uses shared memory (cudaDeviceProp's
# reservedSharedMemPerBlock: 1 KiB from Ampere on) beyond ptxas's figure.  For sm_90,
# ptxas's figure already holds that 1 KiB (a kernel with dynamic shared memory only
# reports 1,024 B of smem for sm_90, 0 B for sm_80 and sm_100; nvJitLink 13, 2026), so
# it is not added again.
SM_LIMITS = {
    (7, 5): dict(threads=1024, blocks=16, regs=65536, smem=65536, warps=32, smem_block=65536, reserved=0),
    (8, 0): dict(threads=2048, blocks=32, regs=65536, smem=167936, warps=64, smem_block=166912, reserved=1024),
    (8, 6): dict(threads=1536, blocks=16, regs=65536, smem=102400, warps=48, smem_block=101376, reserved=1024),
    (8, 7): dict(threads=1536, blocks=16, regs=65536, smem=167936, warps=48, smem_block=166912, reserved=1024),
    (8, 9): dict(threads=1536, blocks=24, regs=65536, smem=102400, warps=48, smem_block=101376, reserved=1024),
    (9, 0): dict(threads=2048, blocks=32, regs=65536, smem=233472, warps=64, smem_block=232448, reserved=0),
    (10, 0): dict(threads=2048, blocks=32, regs=65536, smem=233472, warps=64, smem_block=232448, reserved=1024),
    (12, 0): dict(threads=1536, blocks=32, regs=65536, smem=102400, warps=48, smem_block=101376, reserved=1024),
}

#: Registers one block may use, on every architecture pnex targets.
MAX_REGISTERS_PER_BLOCK = 65536
#: Static shared memory one block may use (more takes dynamic shared memory, opted in).
MAX_STATIC_SHARED = 48 * 1024
#: The most shared memory one block may use on any architecture pnex knows (227 KiB,
#: sm_90 and sm_100): a ``shared_bytes`` above it fits no GPU.
MAX_SHARED_PER_BLOCK = max(limits["smem_block"] for limits in SM_LIMITS.values())
#: Blocks per grid on the X, Y and Z axes.
MAX_GRID = (2**31 - 1, 65535, 65535)


def _limits(arch: str) -> dict[str, int] | None:
    cc = parse_arch(arch)
    return SM_LIMITS.get(cc) or SM_LIMITS.get((cc[0], 0))


def _registers_per_block(registers: int, threads_per_block: int) -> int:
    # Registers are allocated per warp in units of 256.
    warps = -(-threads_per_block // 32)
    return -(-max(registers, 1) * 32 // 256) * 256 * warps


def max_shared_per_block(arch: str) -> int | None:
    """The most shared memory (static plus dynamic) one block may use on ``arch``, in
    bytes (``None``: an architecture pnex does not know)."""
    limits = _limits(arch)
    return None if limits is None else limits["smem_block"]


def _shared_blocks(limits: dict[str, int], shared_bytes: int) -> int:
    """Blocks using ``shared_bytes`` of shared memory (static plus dynamic) one SM holds."""
    if shared_bytes > limits["smem_block"]:
        return 0
    return limits["smem"] // (shared_bytes + limits["reserved"])


def _blocks_by(limits: dict[str, int], registers: int, shared_bytes: int, threads_per_block: int) -> dict[str, int]:
    """Blocks of ``threads_per_block`` threads one SM holds, by each of its limits
    (``shared_bytes``: per block, static plus dynamic)."""
    unused = limits["blocks"] + 1  # a resource the kernel does not use limits nothing
    return {
        "blocks": limits["blocks"],
        "threads": limits["threads"] // threads_per_block,
        "registers": limits["regs"] // _registers_per_block(registers, threads_per_block) if registers else unused,
        "shared memory": _shared_blocks(limits, shared_bytes) if shared_bytes else unused,
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
    dynamic_shared: int = 0,
) -> str | None:
    """Why ``block`` cannot launch this kernel (for a call launching ``n_threads``
    threads per axis), or ``None`` when it can.  ``registers`` and ``shared_bytes``
    (static) are ptxas's figures (``None`` where unknown: those checks are skipped);
    ``dynamic_shared`` the launch's dynamic shared memory (``shared_bytes=``)."""
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
    total = (shared_bytes or 0) + dynamic_shared
    most = max_shared_per_block(arch)
    if dynamic_shared and most is not None and total > most:
        return (
            f"uses {total:,} B of shared memory per block ({shared_bytes or 0:,} B static + {dynamic_shared:,} B "
            f"dynamic, shared_bytes), above the {most:,} B a block may use on {arch}"
        )
    found = occupancy_limiter(arch, registers or 0, total, threads)
    if found is not None and found[0] <= 0:
        return f"not one block of {threads} threads fits on an SM of {arch} (limited by {found[1]})"
    for axis, n in enumerate(n_threads or ()):
        blocks = -(-int(n) // block[axis])
        if blocks > MAX_GRID[axis]:
            return (
                f"needs {blocks:,} blocks on axis {'XYZ'[axis]} for this call, above CUDA's {MAX_GRID[axis]:,}"
            )
    return None


# --------------------------------------------------------------------------- memory under load

# How many bytes each SM must keep in flight (loads issued, data not yet back) for a
# memory-bound kernel to reach the device's bandwidth, for the report's reasons
# (:mod:`pnex_magic.efficiency`).  Little's law says bytes in flight = bandwidth ×
# latency; the latency that counts is the one loads see in a running kernel, which is
# about twice the idle latency a pointer-chasing benchmark measures (requests queue,
# and a thread's load, store and exit, and its block's start, come between two of its
# loads).  The model (:func:`in_flight_share`): an SM keeping ``b`` bytes of loads in
# flight reaches the share ``x / (1 + x**3) ** (1/3)`` of the ceiling, where
# ``x = b / (R × L / SMs)``, ``R`` the read bandwidth at the ceiling and ``L`` the
# latency below: Little's law with a constant latency at low load (the share is ``x``),
# bending smoothly to the ceiling as the memory's queues fill (``x = 1`` gives 79%,
# ``x = 1.82`` gives 95%).
#
# ``L`` per architecture, fitted (least squares on the share) to measured copies
# with one element of each load in flight per thread and resident threads varied;
# the README's "Sources" section names each measurement:
# - sm_90: an H100 SXM 80 GB (132 SMs), `python benchmarks/probes.py inflight`
#   (benchmarks/results/inflight-2026-11-25-h100.json): 2 to 96 KiB per SM, 256
#   threads per block, single loads and f32/f64 vectors: 730 ns (rms error 0.012);
#   it predicts the H200's one-element copy at 0.64-0.68 of torch.clone against 0.64-0.66
#   measured (benchmarks/results/autotune-2026-11-23-*.json).
# - sm_80: RRZE-HPC gpu-benches' stream kernels ("scale": one 8-byte load and store per
#   thread, two blocks per SM of 32 to 512 threads) on an A100 40 GB (gpu-stream) and
#   an A100 80 GB (cuda-stream): 805 and 790 ns.
# - sm_86: the same on an A40 (GDDR6): 550 ns.  sm_89: on an L40 (GDDR6, the L4's Ada
#   chip family and memory type): 455 ns.  sm_70: on a V100: 740 ns.
# - sm_75: no such measurement of a Turing GPU was found; Turing's memory hierarchy has
#   Volta's depth (Jia et al., "Dissecting the NVidia Turing T4 GPU via
#   Microbenchmarking", 2019), so the V100's figure stands in.
# - sm_100, sm_120: no such measurement yet; twice the idle pointer-chasing latency
#   (B200 860 cycles at 1965 MHz, RTX 5090 936 cycles at 2407 MHz, markdewing/AI_kernels),
#   the ratio the measured architectures show (1.7 to 2.4).
#: Seconds, per compute capability: the latency of the bytes-in-flight model above.
LOADED_LATENCY: dict[tuple[int, int], float] = {
    (7, 0): 740e-9,
    (7, 5): 740e-9,
    (8, 0): 800e-9,
    (8, 6): 550e-9,
    (8, 9): 455e-9,
    (9, 0): 730e-9,
    (10, 0): 2 * 860 / 1965e6,
    (12, 0): 2 * 936 / 2407e6,
}

#: The share of the ceiling at which the bytes-in-flight model's knee is quoted
#: (:func:`in_flight_needed`).
IN_FLIGHT_TARGET = 0.95


def loaded_latency(arch: str) -> float | None:
    """The latency (seconds) of ``arch``'s bytes-in-flight model (:data:`LOADED_LATENCY`;
    another minor version of the same major stands in), or ``None`` without one."""
    cc = parse_arch(arch)
    return LOADED_LATENCY.get(cc) or LOADED_LATENCY.get((cc[0], 0))


def in_flight_share(bytes_per_sm: float, knee_bytes: float) -> float:
    """The share of the bandwidth ceiling an SM keeping ``bytes_per_sm`` bytes of loads
    in flight can reach, where ``knee_bytes`` is read bandwidth per SM × latency."""
    x = bytes_per_sm / knee_bytes
    return x / (1 + x**3) ** (1 / 3)


def in_flight_needed(knee_bytes: float, share: float = IN_FLIGHT_TARGET) -> float:
    """Bytes per SM in flight that reach ``share`` of the ceiling (the inverse of
    :func:`in_flight_share`)."""
    return knee_bytes * (share**3 / (1 - share**3)) ** (1 / 3)


# Blocks that do little work are limited by how fast an SM starts them: measured on an
# H100 and an H200 (both 132 SMs), copies of one and two elements per thread in blocks
# of 64 and 128 threads run at 1.59 to 1.65 G blocks per second whatever their bytes in
# flight (benchmarks/results/inflight-2026-11-25-h100.json, autotune-2026-11-23-*.json):
# one block per SM every 81 ns.  No figure for other architectures yet.
#: Seconds between two block starts on one SM, per compute capability.
BLOCK_START: dict[tuple[int, int], float] = {(9, 0): 81e-9}


def block_start(arch: str) -> float | None:
    """The shortest time between two block starts on one SM of ``arch`` (seconds;
    :data:`BLOCK_START`), or ``None`` where not measured."""
    return BLOCK_START.get(parse_arch(arch))


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
    sm_clock_hz: float | None = None  #: the SMs' maximum clock (the driver's "clock rate"), for the compute peaks


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
        sm_clock_hz=_sm_clock_hz(props, index),
    )


def _sm_clock_hz(props: Any, index: int) -> float | None:
    """The SMs' maximum clock in Hz: torch's ``clock_rate`` (kHz), else the driver's
    ``CU_DEVICE_ATTRIBUTE_CLOCK_RATE`` (CUDA 13's runtime no longer reports it)."""
    khz = getattr(props, "clock_rate", None)
    if not khz:
        try:
            from cuda.bindings import driver

            err, dev = driver.cuDeviceGet(index)
            err, khz = driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev)
            khz = int(khz) if err == driver.CUresult.CUDA_SUCCESS else None
        except Exception:
            khz = None
    return float(khz) * 1e3 if khz else None


def _index(device: Any) -> int:
    import torch

    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def device_info(device: Any) -> DeviceInfo:
    """:class:`DeviceInfo` of a CUDA device (a ``torch.device``, or an index), read once."""
    return _device_info(_index(device))


# --------------------------------------------------------------------------- compute peaks

#: What a kernel's arithmetic runs on, for its compute ceiling (:func:`peak_flops`).
PEAK_KINDS = {
    "fp32": "FP32 CUDA-core",
    "fp64": "FP64 CUDA-core",
    "fp16-tc": "FP16/BF16 tensor-core (dense, FP32 accumulate)",
    "tf32-tc": "TF32 tensor-core (dense)",
    "fp64-tc": "FP64 tensor-core",
}

# Floating-point operations per clock per SM (an FMA counts 2; tensor-core figures are
# dense), by compute capability, from NVIDIA's architecture whitepapers (Volta GV100,
# Turing, Ampere GA100 and GA102, Ada, Hopper H100) and checked against the datasheets'
# peaks with the boost clocks they quote: V100 SXM2 125 TFLOP/s FP16 tensor (80 SMs ×
# 1530 MHz × 1024); T4 65 (40 × 1590 × 1024); A100 312 FP16 and 156 TF32 tensor, 19.5
# FP64 and FP64 tensor (108 × 1410 × 2048, 1024, 128 and 128); A40 149.7 FP16 tensor (84
# × 1740 × 1024); L4 121 FP16 and 60 TF32 tensor (58 × 2040 × 1024 and 512); H100 SXM
# 989 FP16 tensor (132 × 1830 × 4096), 67 FP32 (132 × 1980 × 256).  A datasheet quotes
# the tensor-core peak at a lower clock than the FP32 one (H100: 1830 against 1980 MHz):
# pnex multiplies by the one clock the driver reports, the SMs' maximum, so its
# tensor-core peak is the ceiling at that clock (H100 SXM: 1070 TFLOP/s).  No figure yet
# for sm_100 and sm_120's tensor cores and FP64.
FLOPS_PER_CLOCK: dict[tuple[int, int], dict[str, int]] = {
    (7, 0): {"fp32": 128, "fp64": 64, "fp16-tc": 1024},
    (7, 5): {"fp32": 128, "fp64": 4, "fp16-tc": 1024},
    (8, 0): {"fp32": 128, "fp64": 64, "fp16-tc": 2048, "tf32-tc": 1024, "fp64-tc": 128},
    (8, 6): {"fp32": 256, "fp64": 4, "fp16-tc": 1024, "tf32-tc": 512},
    (8, 9): {"fp32": 256, "fp64": 4, "fp16-tc": 1024, "tf32-tc": 512},
    (9, 0): {"fp32": 256, "fp64": 128, "fp16-tc": 4096, "tf32-tc": 2048, "fp64-tc": 256},
    (10, 0): {"fp32": 256},
    (12, 0): {"fp32": 256},
}

#: GeForce cards run FP16/BF16 tensor-core products with FP32 accumulation, and TF32, at
#: half their professional siblings' rate (RTX 3090: 71 TFLOP/s, 82 SMs × 1695 MHz ×
#: 512; RTX 4090: 165, 128 × 2520 × 512).
_HALF_RATE_TENSOR = ("GeForce",)


@dataclasses.dataclass(frozen=True)
class PeakFlops:
    """A compute ceiling: floating-point operations per second, and how it was found."""

    kind: str  #: a key of :data:`PEAK_KINDS`
    flops: float | None  #: per second (``None``: unknown, :attr:`source` says why)
    source: str

    @property
    def label(self) -> str:
        return PEAK_KINDS.get(self.kind, self.kind)


def peak_flops(arch: str, kind: str, sm_count: int | None, clock_hz: float | None, name: str = "") -> PeakFlops:
    """The peak of ``kind`` (:data:`PEAK_KINDS`) on a GPU of ``arch`` with ``sm_count``
    SMs at ``clock_hz``: :data:`FLOPS_PER_CLOCK` × SMs × clock (only the architecture's
    own row: a minor version may differ, sm_87 from sm_80).  ``name`` (the device's)
    picks the GeForce cards' half-rate tensor cores."""
    table = FLOPS_PER_CLOCK.get(parse_arch(arch), {})
    per_clock = table.get(kind)
    if per_clock is None:
        return PeakFlops(kind, None, f"no {PEAK_KINDS.get(kind, kind)} figure for {arch} in pnex's table")
    if kind.endswith("-tc") and kind != "fp64-tc" and any(word in name for word in _HALF_RATE_TENSOR):
        per_clock //= 2
    if not sm_count or not clock_hz:
        return PeakFlops(kind, None, "unknown: the driver reported no SM clock")
    return PeakFlops(
        kind, per_clock * sm_count * clock_hz,
        f"{per_clock:,} FLOP per clock per SM × {sm_count} SMs × {clock_hz / 1e6:.0f} MHz (the SMs' maximum clock)",
    )
