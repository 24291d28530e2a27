"""Derived backward kernels on the GPU (issue 28): the four kernels of the issue pass
``gradcheck`` in float64 on CUDA tensors, match PyTorch's autograd in float32, run under
``torch.compile`` (inductor, the backward graph included) and in CUDA graphs.  Skipped
without a GPU (tests/test_adjoint.py runs the same kernels through the simulator)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import pnex_magic as pnex

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import derived_kernels as ak  # noqa: E402 - benchmarks/derived_kernels.py

pytestmark = pytest.mark.gpu

F64 = torch.float64


def rand(*shape, dtype=F64):
    g = torch.Generator(device="cuda")
    g.seed()
    return torch.randn(*shape, generator=g, dtype=dtype, device="cuda").requires_grad_()


def _cases(k, dtype):
    return {
        "elementwise": (lambda: (rand(1000, dtype=dtype), rand(1000, dtype=dtype)),
                        lambda x, w: k.elementwise(x, w, 0.375), lambda x, w: ak.elementwise_reference(x, w, 0.375)),
        "stencil": (lambda: (rand(33, 47, dtype=dtype),), lambda u: k.stencil(u, 0.25),
                    lambda u: ak.stencil_reference(u, 0.25)),
        "rowsq": (lambda: (rand(37, 19, dtype=dtype), rand(19, dtype=dtype)), k.rowsq, ak.rowsq_reference),
        # one column more than the three gates: no thread reads it, its gradient is zero
        "lltm": (lambda: (rand(17, 3 * 29 + 1, dtype=dtype), rand(17, 29, dtype=dtype)), k.lltm,
                 lambda gates, cell: ak.lltm_reference(gates[:, :-1], cell)),
    }


@pytest.mark.parametrize("case", ["elementwise", "stencil", "rowsq", "lltm"])
def test_gradcheck_in_float64_on_the_gpu(case, gpu_cache, launcher):
    _, op, _ = _cases(ak.kernels(F64, threads=128), F64)[case]
    small = {  # gradcheck's Jacobian is numel x numel: keep the inputs small
        "lltm": lambda: (rand(3, 13), rand(3, 4)),
        "elementwise": lambda: (rand(40), rand(40)),
        "stencil": lambda: (rand(6, 9),),
        "rowsq": lambda: (rand(5, 7), rand(7)),
    }
    assert torch.autograd.gradcheck(op, small[case]())


@pytest.mark.parametrize("case", ["elementwise", "stencil", "rowsq", "lltm"])
def test_float32_gradients_match_pytorch(case, gpu_cache):
    make, op, reference = _cases(ak.kernels(torch.float32, threads=128), torch.float32)[case]
    mine = make()
    theirs = [t.detach().double().requires_grad_() for t in mine]
    outs, refs = op(*mine), reference(*theirs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = refs if isinstance(refs, tuple) else (refs,)
    weights = [torch.randn_like(r) for r in refs]
    sum((o * w.float()).sum() for o, w in zip(outs, weights)).backward()
    sum((r * w).sum() for r, w in zip(refs, weights)).backward()
    for a, b in zip(mine, theirs):
        scale = b.grad.abs().max().item()
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-5 * scale)


def test_opcheck_and_torch_compile_with_inductor(gpu_cache):
    k = ak.kernels(torch.float32, threads=128)
    x, w = rand(64, 33, dtype=torch.float32), rand(33, dtype=torch.float32)
    torch.library.opcheck(k.rowsq, (x, w))
    bwd = pnex.autograd.attached_backward(k.lltm).backward
    gates, cell = rand(8, 3 * 16, dtype=torch.float32), rand(8, 16, dtype=torch.float32)
    torch.library.opcheck(bwd, (gates.detach(), cell.detach(), torch.randn_like(cell), torch.randn_like(cell)))

    @torch.compile(fullgraph=True)
    def loss(gates, cell):
        h, c = k.lltm(gates, cell)
        return (h * h).sum() + c.sum()

    loss(gates, cell).backward()
    g2, c2 = gates.detach().double().requires_grad_(), cell.detach().double().requires_grad_()
    h, c = ak.lltm_reference(g2, c2)
    ((h * h).sum() + c.sum()).backward()
    torch.testing.assert_close(gates.grad.double(), g2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cell.grad.double(), c2.grad, rtol=1e-4, atol=1e-5)


def test_cuda_graphs_replay_the_derived_backward(gpu_cache):
    """A training step's forward and backward, captured once and replayed on new data."""
    k = ak.kernels(torch.float32, threads=128)
    u = torch.randn(64, 80, device="cuda", requires_grad=True)
    static_in = torch.randn(64, 80, device="cuda")
    side = torch.cuda.Stream()  # warm up (loads, autograd's first use) on a side stream, as torch's docs do
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            u.grad = None
            k.stencil(u, 0.25).pow(2).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    u.grad = None
    with torch.cuda.graph(graph):
        with torch.no_grad():
            u.copy_(static_in)
        k.stencil(u, 0.25).pow(2).sum().backward()
    for _ in range(3):
        static_in.copy_(torch.randn(64, 80, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        ref = static_in.double().requires_grad_()
        ak.stencil_reference(ref, 0.25).pow(2).sum().backward()
        torch.testing.assert_close(u.grad.double(), ref.grad, rtol=1e-4, atol=1e-4)
