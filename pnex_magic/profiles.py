"""Recorded figures of the GPUs pnex is used on, so that the report's advice
(:mod:`pnex_magic.efficiency`) can be worked out, and tested, for each of them
without the GPU.

A :class:`DeviceProfile` holds what :func:`~pnex_magic.hardware.device_info` reads
from the driver (SMs, L2, the DRAM peak) and the device-to-device copy the report
measures once per process (its ceiling).  The architecture gives the rest: per-SM
limits (:data:`~pnex_magic.hardware.SM_LIMITS`), the latency of the bytes-in-flight
model (:data:`~pnex_magic.hardware.LOADED_LATENCY`) and the block start rate
(:data:`~pnex_magic.hardware.BLOCK_START`).  The README's "Sources" section cites
every figure.
"""

from __future__ import annotations

import dataclasses

from .errors import PnexError
from .hardware import DeviceInfo

__all__ = ["DeviceProfile", "PROFILES", "profile", "COPY_SHARE_OF_PEAK"]

#: Where no copy was measured, the copy is estimated at this share of the DRAM peak: the
#: measured GPUs' copies reach 0.80 to 0.94 of theirs (HBM 0.80-0.89, GDDR6 0.93-0.94).
COPY_SHARE_OF_PEAK = 0.9


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """The figures of one GPU model that the report's reasons read."""

    name: str
    arch: str
    sm_count: int
    l2_bytes: int
    peak_bandwidth: float  #: bytes per second, from the spec sheet
    copy_bandwidth: float  #: bytes per second (read + written) of a device-to-device copy
    copy_measured: bool  #: False: estimated at COPY_SHARE_OF_PEAK of the peak
    sm_clock_hz: float | None = None  #: the SMs' maximum clock (the driver's "clock rate")

    @property
    def info(self) -> DeviceInfo:
        """The :class:`~pnex_magic.hardware.DeviceInfo` the driver would give."""
        return DeviceInfo(self.name, self.arch, self.sm_count, self.l2_bytes, self.peak_bandwidth,
                          "the spec sheet's peak (a recorded profile)", self.sm_clock_hz)


_MIB = 1 << 20

PROFILES: dict[str, DeviceProfile] = {p.name: p for p in (
    # Measured by this project: the H100 on 2026-11-25 (benchmarks/results/logs-2026-11-25/eff.txt:
    # the report's copy 2.86 TB/s; the driver's L2 and peak in inflight-2026-11-25-h100.json), the
    # H200 on 2026-11-23 (the report's copy 3.71-3.93 TB/s, autotune-2026-11-23-*.json; its L2 as the
    # driver gives it, 62,914,560 B = 60 MiB, in the notebooks' reports saved from it: the same GH100
    # chip as the H100 SXM, with more of its L2 enabled).
    # The SM clocks: the datasheets' maximum boost clocks, which the driver reports as the clock rate
    # (an H200 read 1980 MHz in nvidia-smi after matrix products here, 2026-10-28).
    DeviceProfile("H100 SXM", "sm_90", 132, 50 * _MIB, 3.35e12, 2.86e12, True, 1.98e9),
    DeviceProfile("H200", "sm_90", 132, 60 * _MIB, 4.8e12, 3.83e12, True, 1.98e9),
    # NVIDIA's A100 datasheet and whitepaper (108 SMs, 40 MB L2, 1,555 GB/s); the copy: RRZE-HPC
    # gpu-benches, gpu-stream/a100_40.txt, the "scale" kernel at full occupancy.
    DeviceProfile("A100 40GB", "sm_80", 108, 40 * _MIB, 1.555e12, 1.38e12, True, 1.41e9),
    # NVIDIA's L4 datasheet (7,424 CUDA cores: 58 SMs of 128; 48 MB L2; 300 GB/s GDDR6).
    DeviceProfile("L4", "sm_89", 58, 48 * _MIB, 300e9, COPY_SHARE_OF_PEAK * 300e9, False, 2.04e9),
    # NVIDIA's T4 datasheet and Turing whitepaper (2,560 CUDA cores: 40 SMs of 64; TU104's 4 MB
    # L2; 320 GB/s GDDR6).
    DeviceProfile("T4", "sm_75", 40, 4 * _MIB, 320e9, COPY_SHARE_OF_PEAK * 320e9, False, 1.59e9),
)}


def profile(name: str) -> DeviceProfile:
    """The recorded profile called ``name`` (one of :data:`PROFILES`)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise PnexError(f"no recorded profile {name!r}: the profiles are {', '.join(map(repr, PROFILES))}") from None
