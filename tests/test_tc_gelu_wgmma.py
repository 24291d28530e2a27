"""The cp.async wgmma GEMM's staged bias + GELU epilogue (examples/tensor_cores/gemm_wgmma.py,
``make_linear(..., gelu=True)`` with dynamic shared memory) without a GPU: the float32
accumulators staged into the freed tile buffers, bias and GELU applied in the store loop
by every thread of the block; ``gelu(a @ w.T + bias)`` in the simulator against float64,
every element of a poisoned output written.  Tile choices whose float32 tile does not
fit the buffers are refused.  Its machine code (registers only, straight-line staging)
is checked in test_tc_examples_sass.py; the unstaged, static GELU path in test_tc.py."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]


def _gemm_wgmma():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    import gemm_wgmma

    return gemm_wgmma


@pytest.mark.parametrize("dtype,bm,bn,stages,pipelined", [
    # 128 threads, 32 chunks a row: 4 rows a step, so a thread's rows alternate between the
    # plain rows and the pairwise swapped ones; 2 row blocks of C
    ("f16", 64, 256, 2, False),
    # 256 threads, 16 chunks a row (16 rows a step); the float32 tile fills the 3 buffers'
    # first 64 KiB; 2 column blocks of C (the bias read at n0 + col)
    ("bf16", 128, 128, 3, True),
])
def test_wgmma_gemm_staged_gelu_epilogue_on_cpu(dtype, bm, bn, stages, pipelined, poisoned):
    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    gen = torch.Generator().manual_seed(53 + bn)
    m, n, k = 128, 256, 128  # 2 k-tiles
    a = torch.randn(m, k, generator=gen).to(tdt)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(tdt)
    bias = torch.randn(n, generator=gen).to(tdt)
    op = _gemm_wgmma().make_linear(dtype, bm, bn, stages, pipelined=pipelined, gelu=True)
    c = op(a, w, bias)
    assert c.dtype == tdt and c.shape == (m, n) and not c.isnan().any()
    product = a.double() @ w.double().t()
    ref = F.gelu(product + bias.double())
    ulp = 2**-11 if dtype == "f16" else 2**-8  # one rounding to float16 / bfloat16
    assert ((c.double() - ref).abs() <= ref.abs() * ulp + 2e-3).all()
    # the bias and the GELU both count: the product alone, or without the bias, is far off
    assert (c.double() - product).abs().max() > 0.1
    assert (c.double() - F.gelu(product)).abs().max() > 0.1


def test_gelu_tiles_that_do_not_fit_are_refused():
    gemm_wgmma = _gemm_wgmma()
    with pytest.raises(ValueError, match=r"make_linear\(gelu=True\): BN = 256 with STAGES = 2: the float32 tile .* "
                                         r"\(128 KiB\) does not fit the 2 tile buffers it reuses \(96 KiB\); give "
                                         r"stages >= 3 for BN = 256"):
        gemm_wgmma.make_linear("f16", 128, (128, 256), (2, 3), pipelined=False, gelu=True)
    with pytest.raises(ValueError, match=r"make_linear\(gelu=True\): BN must be 32, 64, 128 or 256 .* got 96"):
        gemm_wgmma.make_linear("f16", 64, 96, 3, gelu=True)
    # where nothing is staged as float32 (the unstaged epilogue; the plain GEMM), the same choice is taken
    gemm_wgmma.make_linear("f16", 128, 256, 2, pipelined=False, gelu=True, staged=False)
    gemm_wgmma.make_linear("f16", 128, 256, 2, pipelined=False)


@pytest.mark.parametrize("bm", [64, 128])
def test_the_shared_memory_asked_holds_the_float32_tile(bm):
    """Every variant of the staged GELU op asks for at least its BM x BN float32 tile."""
    op = _gemm_wgmma().make_linear("f16", bm, (64, 128, 256), (3, 4), gelu=True)
    spec = op.definition.spec
    assert [p.name for p in spec.arguments] == ["a", "w", "bias"]  # c is the output
    for variant, asked in enumerate(spec.shared_per_variant):
        assert asked >= bm * spec.tune_values(variant)["BN"] * 4, (variant, spec.tune_values(variant), asked)
