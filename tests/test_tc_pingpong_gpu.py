"""The ping-pong GEMM (examples/tensor_cores/gemm_pingpong.py) on a Hopper GPU: the
plain product and the fused bias + GELU against float64 on fresh inputs into NaN-filled
outputs, at shapes that give a block one tile, an odd number of tiles (the second
warpgroup idle at the end) and many (the staging buffers, bias rows and turns going round).
Skipped with a reason where there is no sm_90 GPU (marker ``gpu``)."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]
SHAPES = ((128, 128, 64), (384, 640, 320), (2048, 1024, 2048), (4096, 4096, 512))
PAIRED = ((256, 128, 64), (768, 640, 320), (2048, 1024, 2048), (4096, 4096, 512))  # clusters: M a multiple of 256


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("TMA, mbarrier transaction counts and wgmma need an sm_90 GPU (H100, H200)")


def _pingpong():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    import gemm_pingpong

    return gemm_pingpong


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("stages", [5, 3])
@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("cluster", [1, 2])
def test_pingpong_gemm_on_gpu(dtype, stages, gelu, cluster, poisoned):
    lin = _pingpong().PingPongLinear(dtype, stages, gelu=gelu, cluster=cluster)
    _check(lin, dtype, gelu, SHAPES if cluster == 1 else PAIRED, stages + 10 * gelu + 100 * cluster)


def _check(lin, dtype, gelu, shapes, seed):
    """``lin`` against float64 at each of ``shapes`` (M, N, K), on fresh inputs."""
    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=tdt, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=tdt, generator=gen) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=tdt, generator=gen)
        c = lin(a, w, bias) if gelu else lin(a, w)
        assert not c.isnan().any(), (m, n, k)
        ref = a.double() @ w.double().t()
        if gelu:
            ref = F.gelu(ref + bias.double())
        ulp = 2**-11 if dtype == "f16" else 2**-8
        assert ((c.double() - ref).abs() <= ref.abs() * ulp + 4e-3).all(), (m, n, k)


@pytest.mark.parametrize("tile", [(128, 128), (64, 256)])
@pytest.mark.parametrize("gelu", [False, True])
def test_pingpong_gemm_with_few_blocks_on_gpu(gelu, tile, poisoned):
    """One block for 32 or 64 tiles (each warpgroup half of them in turn), then 3 and 7:
    the turns, the halves of each warpgroup's staging buffer and its two bias rows go
    round many times."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(1024, 256, device="cuda", dtype=torch.float16, generator=gen)
    w = torch.randn(512 if tile == (128, 128) else 1024, 256, device="cuda", dtype=torch.float16, generator=gen) / 16
    bias = torch.randn(w.shape[0], device="cuda", dtype=torch.float16, generator=gen)
    mod = _pingpong()
    from pnex_magic import tc

    op = mod.make_linear_pingpong("f16", 4, gelu=gelu, tile=tile)
    maps = (tc.tensor_map(a, (tile[0], 64)), tc.tensor_map(w, (tile[1], 64)))
    ref = a.double() @ w.double().t()
    if gelu:
        ref = F.gelu(ref + bias.double())
    for blocks in (1, 3, 7):
        c = op(a, w, bias, *maps, blocks) if gelu else op(a, w, *maps, blocks)
        assert ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 4e-3).all(), blocks


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("gelu", [False, True])
def test_pingpong_64x256_tiles_on_gpu(dtype, gelu, poisoned):
    """Each warpgroup's tile 64 x 256 (one wgmma m64n256k16 a step), 4 buffers."""
    lin = _pingpong().PingPongLinear(dtype, 4, gelu=gelu, tile=(64, 256))
    _check(lin, dtype, gelu, ((64, 256, 64), (192, 768, 320), (2048, 1024, 2048), (4096, 4096, 512)), 64 + gelu)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("kernel", ["pingpong", "tma"])
def test_gelu_poly_epilogue_on_gpu(dtype, kernel, poisoned):
    """``activation="gelu_poly"`` (the GELU from ``exp2`` of a polynomial) in the ping-pong
    and TMA kernels, against float64 as the erf form is."""
    mod = _pingpong()
    from gemm_tma import TmaLinear

    lin = (mod.PingPongLinear(dtype, 5, gelu=True, activation="gelu_poly") if kernel == "pingpong" else
           TmaLinear(dtype, 256, 4, gelu=True, activation="gelu_poly"))
    _check(lin, dtype, True, ((128, 256, 64), (384, 768, 320), (2048, 1024, 2048)), 77 + (dtype == "bf16"))
