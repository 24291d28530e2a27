"""The clocks :mod:`pnex_magic.timing` times with: a :data:`Timer` runs ``fn()``
``loops`` times and returns the elapsed seconds.

* :func:`cuda_event_timer` brackets the calls with CUDA events on the current
  stream: the GPU time of the run as a user's loop sees it, the CPU's cost per call
  included where the CPU cannot keep ahead of the GPU.
* :func:`cuda_graph_timer` captures the ``loops`` calls in one CUDA graph and times
  its replay: the GPU's time alone.  The report times with it while an op's calls go
  through the Python launcher for a while (the C++ launcher is being built in a fresh
  environment): that launcher's tens of microseconds a call would otherwise be timed
  instead of the kernel, and the advice drawn from the figures would be wrong.  This
  is how ``triton.testing.do_bench_cudagraph`` leaves launch costs out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Timer", "CaptureRefused", "cuda_event_timer", "cuda_graph_timer"]

#: ``timer(fn, loops)`` calls ``fn()`` ``loops`` times and returns the elapsed seconds.
Timer = Callable[[Callable[[], Any], int], float]


class CaptureRefused(RuntimeError):
    """``fn`` cannot run under CUDA-graph capture (it synchronises, reads a result on
    the CPU, ...): time it with :func:`cuda_event_timer` instead."""


def cuda_event_timer(device: Any = None) -> Timer:
    """A :data:`Timer` that brackets the calls with CUDA events on the current stream
    of ``device`` and waits for the end event: GPU time of the whole run, launch
    overhead included where the CPU cannot keep ahead of the GPU."""
    import torch

    def timer(fn: Callable[[], Any], loops: int) -> float:
        def run() -> None:
            for _ in range(loops):
                fn()

        with torch.cuda.device(device):
            return _elapsed(run)

    return timer


def cuda_graph_timer(device: Any = None) -> Timer:
    """A :data:`Timer` that captures ``loops`` calls of ``fn`` in one CUDA graph (once
    per function and loop count, outside the timed span) and times a replay with CUDA
    events: the GPU's time for the calls, none of the CPU's.  ``fn`` must have run once
    outside capture (its code loaded, an autotuned choice made).  Raises
    :class:`CaptureRefused` where ``fn`` cannot be captured."""
    import torch

    graphs: dict[tuple[int, int], tuple[Any, Callable[[], Any]]] = {}

    def timer(fn: Callable[[], Any], loops: int) -> float:
        with torch.cuda.device(device):
            key = (id(fn), loops)
            if key not in graphs:
                graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(graph):
                        for _ in range(loops):
                            fn()
                except Exception as exc:  # noqa: BLE001 -- whatever the capture refused
                    torch.cuda.synchronize()
                    raise CaptureRefused(f"{type(exc).__name__}: {exc}") from exc
                graphs[key] = (graph, fn)  # fn kept alive: its id stays its own
            return _elapsed(graphs[key][0].replay)

    return timer


def _elapsed(run: Callable[[], Any]) -> float:
    """Seconds of GPU time between CUDA events recorded on the current stream before and
    after ``run()``, once the end event is reached."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds
