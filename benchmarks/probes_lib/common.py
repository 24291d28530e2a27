"""What the probes of ``benchmarks/probes.py`` share: ``HERE`` (benchmarks/), ``OUT`` (where logs
and child scripts go: ``$OUT``, else /tmp/probes) and ``_events`` (median CUDA-event time of a call)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path


HERE = Path(__file__).resolve().parents[1]  # benchmarks/
OUT = Path(os.environ.get("OUT", "/tmp/probes"))


def _events(fn, reps=20):
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)
