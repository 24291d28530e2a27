"""pnex.tc on a GPU: every primitive's result on the hardware equals the simulator's
(bit for bit where the operation is exact), and the GEMM example computes a matrix
product.  Skipped with a reason where there is no GPU (marker ``gpu``)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import tc_kernels as K  # noqa: E402
from test_tc import _ldmatrix_reference, _mma_inputs, mma_op  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]


def _needs_sm80():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the tensor-core primitives need sm_80 or newer")


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
def test_mma_on_gpu_equals_the_simulator_and_the_product(kind):
    _needs_sm80()
    for seed in range(3):
        args, ref = _mma_inputs(kind, torch.Generator().manual_seed(100 + seed))
        cpu = mma_op(kind)(*args)
        gpu = mma_op(kind)(*(a.cuda() for a in args)).cpu()
        torch.testing.assert_close(gpu.double(), ref, rtol=2e-6, atol=2e-6)
        # the hardware's accumulation order differs from float64-then-round by at most a few ulps
        torch.testing.assert_close(gpu, cpu, rtol=4e-7 * 8, atol=1e-6)


@pytest.mark.parametrize("count,trans", [(1, False), (2, False), (4, False), (1, True), (2, True), (4, True)])
def test_ldmatrix_on_gpu_is_the_isa_layout(count, trans):
    _needs_sm80()
    tile = torch.randn(32, 16, generator=torch.Generator().manual_seed(count + 10 * trans)).half()
    op = K._ldmatrix_kernel(count, trans)
    gpu = op(tile.cuda()).cpu().view(torch.int32).numpy()
    want = _ldmatrix_reference(tile.numpy(), count, trans)
    assert np.array_equal(gpu[:, :count], want[:, :count])
    assert np.array_equal(gpu, op(tile).view(torch.int32).numpy())


def test_cp_async_on_gpu():
    _needs_sm80()
    src = torch.randn(16, 64, generator=torch.Generator().manual_seed(3)).half()
    for valid in (16, 11, 0):
        dst = K.cp_async_copy(src.cuda(), valid).cpu()
        want = src.clone()
        want[valid:] = 0
        assert torch.equal(dst, want)


def test_reductions_shuffles_and_packing_on_gpu_equal_the_simulator():
    _needs_sm80()
    x = torch.randn(128, generator=torch.Generator().manual_seed(5))
    gpu, cpu = K.reductions(x.cuda()).cpu(), K.reductions(x)
    assert torch.equal(gpu[:, :2], cpu[:, :2])  # the same butterfly: the same rounding
    torch.testing.assert_close(gpu[:, 2:4], cpu[:, 2:4], rtol=1e-6, atol=1e-5)
    assert torch.equal(gpu[:, 4], cpu[:, 4]) and torch.equal(gpu[:, 4], x.max().expand(128))  # block_max: exact
    v = torch.randint(-1000, 1000, (32,), generator=torch.Generator().manual_seed(6), dtype=torch.int32)
    assert torch.equal(K.shuffles(v.cuda()).cpu(), K.shuffles(v))
    p = torch.randn(32, 2, generator=torch.Generator().manual_seed(8)) * 100
    assert torch.equal(K.packing(p.cuda()).cpu().view(torch.int32), K.packing(p).view(torch.int32))


def test_unpacking_on_gpu_equals_the_simulator():
    """``unpack_f16x2``/``unpack_bf16x2`` on the GPU: bit for bit what the simulator gives
    (NaN payloads aside: the GPU's conversion may quiet them)."""
    from test_tc import _unpack_words

    words = _unpack_words()[0].view(torch.uint32)
    gpu, cpu = K.unpacking(words.cuda()).cpu(), K.unpacking(words)
    torch.testing.assert_close(gpu, cpu, rtol=0, atol=0, equal_nan=True)


def test_exp2_approx_on_gpu_is_within_the_isa_bound():
    """``ex2.approx.ftz.f32``: within 2**-21 of 2 ** x (relative) where the result is a
    normal float32, and flushed to zero below, as the simulator."""
    _needs_sm80()
    from test_tc import _exp2_inputs

    x = _exp2_inputs()
    gpu, cpu = K.exp2s(x.cuda()).cpu().double(), K.exp2s(x).double()
    want = torch.exp2(x.double())
    normal = (want >= 2.0**-126) & (want < 2.0**128)
    worst = ((gpu[normal] - want[normal]).abs() / want[normal]).max().item()
    assert worst <= 2.0**-21, worst
    assert torch.equal(gpu[~normal], cpu[~normal])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("mnk", [(128, 128, 32), (256, 384, 512), (1024, 512, 2048)])
def test_gemm_example_on_gpu(dtype, mnk):
    _needs_sm80()
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_mma import make_gemm

    m, n, k = mnk
    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    gen = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, k, generator=gen).to(tdt).cuda()
    b = torch.randn(k, n, generator=gen).to(tdt).cuda()
    c = make_gemm(dtype)(a, b)
    ref = a.double() @ b.double()
    # float32 accumulation, one rounding to the output dtype
    ulp = 2**-11 if dtype == "f16" else 2**-8
    err = (c.double() - ref).abs()
    assert bool((err <= ref.abs() * ulp + 1e-2 * k ** 0.5 * 2**-10).all()), float(err.max())
