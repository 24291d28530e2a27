"""What the tests of derived backward kernels share (tests/test_adjoint.py, test_adjoint_refused.py,
test_adjoint_generated.py): ``rand`` (fresh float64 inputs that need gradients), ``K`` (benchmarks/derived_kernels.py's kernels in float64) and
``_plans`` (how a derived backward writes each gradient, and its source)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pnex_magic.adjoint import derive_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import derived_kernels as ak  # noqa: E402 - benchmarks/derived_kernels.py

F64 = torch.float64


def rand(*shape, dtype=F64, low=None):
    g = torch.Generator()
    g.seed()  # fresh inputs every run
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    if low is not None:
        t = t.abs() + low
    return t.to(dtype).requires_grad_()


K = ak.kernels(F64)


def _plans(op):
    derived = derive_kernel(op.definition.fn, op.spec)
    return {p.tensor: p.mode for p in derived.plans}, derived.source
