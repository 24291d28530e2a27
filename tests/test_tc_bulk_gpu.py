"""pnex.tc's bulk tensor copies and mbarriers on a Hopper GPU: the hardware's copy is the
simulator's (the same box in the same swizzle, zeros outside), barrier phases alternate,
and the warp-specialised GEMMs compute a matrix product.  Skipped with a reason where
there is no sm_90 GPU (marker ``gpu``)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_tc_bulk import COLS, ROWS, box_reference, rounds, tma_box  # noqa: E402

from pnex_magic import tc  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("TMA, mbarrier transaction counts and wgmma need an sm_90 GPU (H100, H200)")


@pytest.mark.parametrize("row,col", [(0, 0), (8, 64), (40, 8), (-3, 0), (44, 104), (-20, 0)])
def test_tma_load_on_gpu_is_the_simulators(row, col):
    gen = torch.Generator().manual_seed(row * 1000 + col)
    src = torch.randn(48, 160, generator=gen).half()
    want = box_reference(src, row, col)
    gpu = src.cuda()
    desc = tc.tensor_map(gpu, (ROWS, COLS))
    assert desc.device.type == "cuda" and desc.shape == (128,)
    assert torch.equal(tma_box(gpu, desc, row, col).cpu(), want)
    assert torch.equal(tma_box(src, tc.tensor_map(src, (ROWS, COLS)), row, col), want)


def test_barrier_rounds_on_gpu():
    out = rounds(torch.arange(32, dtype=torch.int32, device="cuda"), 7)
    assert out.tolist() == [7 + i for i in range(32)]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("bn,stages,persistent", [(256, 4, False), (128, 6, False), (256, 3, True), (256, 4, True),
                                                  (128, 5, True)])
def test_warp_specialised_gemm_on_gpu(dtype, bn, stages, persistent):
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_tma import TmaLinear

    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    lin = TmaLinear(dtype, bn, stages, persistent)
    gen = torch.Generator(device="cuda").manual_seed(bn + stages)
    for m, n, k in ((128, bn, 64), (384, 3 * bn, 320), (1024, 1024, 2048)):
        a = torch.randn(m, k, device="cuda", dtype=tdt, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=tdt, generator=gen)
        c = lin(a, w)
        ref = a.double() @ w.double().t()
        err = float(torch.linalg.norm((c.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
        assert err < (2e-3 if dtype == "f16" else 1e-2), (m, n, k, err)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("bn,stages,cluster,persistent", [(256, 4, 1, False), (256, 3, 1, False), (128, 4, 1, False),
                                                          (256, 4, 2, False), (256, 4, 1, True), (128, 5, 1, True),
                                                          (256, 4, 2, True)])
def test_tma_gemm_gelu_epilogue_on_gpu(dtype, bn, stages, cluster, persistent, poisoned):
    """gelu(a @ w.T + bias) fused into the TMA GEMM's epilogue (the persistent kernel's
    too), against float64 on fresh inputs and NaN-filled outputs (every element written)."""
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_tma import TmaLinear

    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    lin = TmaLinear(dtype, bn, stages, persistent, cluster=cluster, gelu=True)
    gen = torch.Generator(device="cuda").manual_seed(bn + stages + cluster)
    for m, n, k in ((256, bn, 64), (512, 3 * bn, 320), (2048, 1024, 2048), (4096, 2048, 256)):
        a = torch.randn(m, k, device="cuda", dtype=tdt, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=tdt, generator=gen) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=tdt, generator=gen)
        c = lin(a, w, bias)
        assert not c.isnan().any(), (m, n, k)
        ref = F.gelu(a.double() @ w.double().t() + bias.double())
        err = float(torch.linalg.norm((c.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
        assert err < (2e-3 if dtype == "f16" else 1e-2), (m, n, k, err)
        ulp = 2**-11 if dtype == "f16" else 2**-8
        assert ((c.double() - ref).abs() <= ref.abs() * ulp + 4e-3).all(), (m, n, k)


def test_cp_async_wgmma_gemm_tunes_the_tile_widths_that_divide_n(gpu_cache):
    """``make_linear``'s ``BN: Tune(128, 256)`` with ``tune_requires`` naming N: N = 384
    times and runs BN = 128 only, N = 512 (the same power-of-two bucket) times both; each
    product right."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_wgmma import make_linear

    from pnex_magic.launch import autotune

    linear = make_linear("f16", 128, (128, 256), (3, 4))
    gen = torch.Generator(device="cuda").manual_seed(7)
    for n, widths in ((384, {128}), (512, {128, 256})):
        a = torch.randn(256, 320, device="cuda", dtype=torch.float16, generator=gen)
        w = torch.randn(n, 320, device="cuda", dtype=torch.float16, generator=gen)
        c = linear(a, w)
        ref = a.double() @ w.double().t()
        err = float(torch.linalg.norm((c.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
        assert err < 2e-3, (n, err)
        result = autotune.result_for(linear.definition, (a, w))
        assert result.source == "benchmarked"
        assert {dict(r.tune)["BN"] for r in result.candidates if r.seconds is not None} == widths, n
