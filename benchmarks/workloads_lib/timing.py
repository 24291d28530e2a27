"""How the workloads time a call: CUDA events on a GPU, the wall clock on CPU (where the
numbers are the simulator's), the host's time to issue a call, and the memory floor (a
``torch`` copy moving the same bytes)."""

import time
from collections.abc import Callable
from typing import Any

import torch

from pnex_magic.timing import Measurement, cuda_event_timer, measure

__all__ = ["time_per_call", "host_seconds", "copy_time", "dram_copy_bandwidth"]


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
