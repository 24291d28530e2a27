"""The TMA GEMM's fused bias + GELU epilogue (examples/tensor_cores/gemm_tma.py,
``make_linear_tma(..., gelu=True)``) without a GPU: ``gelu(a @ w.T + bias)`` in the
simulator against float64, every element of a poisoned output written; the tile
choices whose float32 staging does not fit are refused, and so are calls that pass the
bias to the plain op or leave it out of the GELU one.  Its machine code (registers only,
straight-line staging) is checked in test_tc_examples_sass.py; on a GPU in
test_tc_bulk_gpu.py."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]


def _gemm_tma():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    import gemm_tma

    return gemm_tma


@pytest.mark.parametrize("dtype,bn", [("f16", 128), ("bf16", 64)])
def test_tma_gemm_gelu_epilogue_on_cpu(dtype, bn, poisoned):
    """One block: a producer warp, two consumer warpgroups, 2 k-tiles through 2 buffers;
    the float32 tile staged into the freed buffers (BN = 128 fills both exactly), then
    bias and GELU in the 16-byte store loop."""
    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    gen = torch.Generator().manual_seed(43 + bn)
    a = torch.randn(128, 128, generator=gen).to(tdt)
    w = (torch.randn(bn, 128, generator=gen) / 128 ** 0.5).to(tdt)
    bias = torch.randn(bn, generator=gen).to(tdt)
    c = _gemm_tma().TmaLinear(dtype, bn, 2, gelu=True)(a, w, bias)
    assert c.dtype == tdt and c.shape == (128, bn) and not c.isnan().any()
    ref = F.gelu(a.double() @ w.double().t() + bias.double())
    ulp = 2**-11 if dtype == "f16" else 2**-8
    assert ((c.double() - ref).abs() <= ref.abs() * ulp + 2e-3).all()
    # the bias and the GELU both count: the product alone, or without the bias, is far off
    assert (c.double() - (a.double() @ w.double().t())).abs().max() > 0.1
    assert (c.double() - F.gelu(a.double() @ w.double().t())).abs().max() > 0.1


def test_persistent_tma_gemm_gelu_on_cpu(poisoned):
    """The persistent kernel's fused epilogue in the simulator (its plain GEMM:
    test_tc_bulk.py): 2 blocks walk 4 tiles of 128 x 128 (2 each: every buffer's barriers
    go round again on the second tile, and each block's second tile is in the other
    column block, so the bias staged in shared memory for the first must be replaced),
    3 k-tiles through 2 buffers, each tile staged in two 64-column float16 chunks through
    the two halves of the staging buffer, bias and GELU applied in registers; every element
    of a poisoned output written, against float64."""
    gen = torch.Generator().manual_seed(54)
    a = torch.randn(256, 192, generator=gen).half()
    w = (torch.randn(256, 192, generator=gen) / 192 ** 0.5).half()
    bias = torch.randn(256, generator=gen).half()
    c = _gemm_tma().TmaLinear("f16", 128, 2, persistent=True, gelu=True)(a, w, bias)
    product = a.double() @ w.double().t()
    ref = F.gelu(product + bias.double())
    assert c.shape == (256, 256) and not c.isnan().any()
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 2e-3).all()
    assert (c.double() - product).abs().max() > 0.1


def test_staging_swizzle_is_a_permutation_of_each_row():
    """The float32 staging layout (epilogue.f32_unit and the pair swap of rows 4-7) loses
    no element: the stored positions of a row are its columns, in another order."""
    _gemm_tma()
    import epilogue

    unit = epilogue.f32_unit.py_func
    for bn in (32, 64, 128, 256):
        for row in range(8):
            stored = {(unit(row, col >> 2) << 2) + ((col & 3) ^ ((row >> 2) & 1)) for col in range(bn)}
            assert stored == set(range(bn)), (bn, row)


def test_gelu_tiles_that_do_not_fit_are_refused():
    gemm_tma = _gemm_tma()
    with pytest.raises(ValueError, match=r"BN = 256 with STAGES = 2: the float32 tile .* \(128 KiB\) does not fit the "
                                         r"2 tile buffers it reuses \(96 KiB\); give stages >= 3 for BN = 256"):
        gemm_tma.make_linear_tma("f16", (128, 256), (2, 3), gelu=True)
    with pytest.raises(ValueError, match="BN must be 32, 64, 128 or 256 .* got 96"):
        gemm_tma.make_linear_tma("f16", 96, 4, gelu=True)
    with pytest.raises(ValueError, match=r"STAGES = 5 buffers of 48 KiB and the 32 KiB staging buffer do not fit the "
                                         r"block's 227 KiB at BN = 256; give 2 to 4 stages"):
        gemm_tma.TmaLinear("f16", 256, 5, persistent=True, gelu=True)
    with pytest.raises(ValueError, match="make_linear_persistent: BN must be 128 or 256 .* got 64"):
        gemm_tma.make_linear_persistent("f16", 64, 4)


def test_the_plain_op_takes_the_tiles_the_gelu_op_refuses(poisoned):
    """BN = 256 with STAGES = 2 (96 KiB of buffers): the plain kernel never carves the
    128 KiB float32 tile (the simulator refuses a tile past the shared memory asked for)."""
    gen = torch.Generator().manual_seed(47)
    a = torch.randn(128, 64, generator=gen).half()
    w = (torch.randn(256, 64, generator=gen) / 8).half()
    c = _gemm_tma().TmaLinear("f16", 256, 2)(a, w)
    ref = a.double() @ w.double().t()
    assert not c.isnan().any() and ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 1e-3).all()


def test_bias_goes_with_the_gelu_op_only():
    gemm_tma = _gemm_tma()
    a, w, bias = torch.zeros(128, 64).half(), torch.zeros(64, 64).half(), torch.zeros(64).half()
    with pytest.raises(TypeError, match=r"the GELU epilogue needs bias: lin\(a, w, bias\)"):
        gemm_tma.TmaLinear("f16", 64, 2, gelu=True)(a, w)
    with pytest.raises(TypeError, match=r"bias is for the GELU epilogue \(TmaLinear\(..., gelu=True\)\)"):
        gemm_tma.TmaLinear("f16", 64, 2)(a, w, bias)
    plain, fused = gemm_tma.make_linear_tma("f16", 64, 2), gemm_tma.make_linear_tma("f16", 64, 2, gelu=True)
    assert [p.name for p in plain.definition.spec.arguments][:4] == ["a", "w", "a_map", "w_map"]
    assert [p.name for p in fused.definition.spec.arguments][:5] == ["a", "w", "bias", "a_map", "w_map"]
