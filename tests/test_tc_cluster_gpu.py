"""Thread-block clusters and TMA multicast on a Hopper GPU: ranks, multicast copies and
remote arrivals give the simulator's results, a grid of partial clusters is refused by
the C++ and the Python launchers in the same words, and the clustered GEMM computes a
matrix product.  Skipped with a reason where there is no sm_90 GPU (marker ``gpu``)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_tc_cluster import halves, ping_pong, ranks  # noqa: E402

from pnex_magic import tc  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("thread-block clusters, TMA multicast and wgmma need an sm_90 GPU (H100, H200)")


def test_ranks_multicast_and_remote_arrivals_on_gpu_are_the_simulators():
    x = torch.zeros(4, 4 * 32)
    assert torch.equal(ranks(x.cuda()).cpu(), ranks(x))
    src = torch.randn(64, 64, generator=torch.Generator().manual_seed(9)).half()
    want = halves(src, tc.tensor_map(src, (8, 64)))
    gpu = src.cuda()
    assert torch.equal(halves(gpu, tc.tensor_map(gpu, (8, 64))).cpu(), want)


def test_remote_arrivals_on_gpu():
    with torch.device("cuda"):  # ping_pong takes no tensor: the op's device is the default one
        out = ping_pong(1000)
    assert out.device.type == "cuda" and out.tolist() == [1000, 1000]


_PARTIAL = (r"\(\): the grid \(3 x 4 x 1 blocks\) is not a whole number of clusters of cluster_dims=\(2, 2, 1\) "
            r"\(x: 3 blocks, not a multiple of 2\)")


def test_a_grid_of_partial_clusters_is_refused_by_the_cpp_launcher():
    from pnex_magic import launch

    if not launch.wait_for_launcher(180) or not launch.native_registered(ranks.definition.op_name):
        pytest.skip("the C++ launcher does not serve this op here")
    with pytest.raises(ValueError, match="ranks" + _PARTIAL):
        ranks(torch.zeros(4, 3 * 32, device="cuda"))
    assert torch.equal(ranks(torch.zeros(4, 4 * 32, device="cuda")).cpu(), ranks(torch.zeros(4, 4 * 32)))


def test_a_grid_of_partial_clusters_is_refused_by_the_driver_launcher(monkeypatch):
    import pnex_magic as pnex
    from numba import cuda

    monkeypatch.setenv("PNEX_LAUNCHER", "driver")  # read when the op is made

    @pnex.jit(n_threads=("x.size(1)", "x.size(0)"), threads_per_block=(32, 1), cluster_dims=(2, 2))
    def ranks_by_driver(x: pnex.In("f32", (None, None)), out: pnex.Out("i32", (4, 4), init=-1)):
        if cuda.threadIdx.x == 0:
            out[cuda.blockIdx.y, cuda.blockIdx.x] = tc.cluster_ctarank()

    with pytest.raises(ValueError, match="ranks_by_driver" + _PARTIAL):
        ranks_by_driver(torch.zeros(4, 3 * 32, device="cuda"))
    assert torch.equal(ranks_by_driver(torch.zeros(4, 4 * 32, device="cuda")).cpu(), ranks(torch.zeros(4, 4 * 32)))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("bn,stages,persistent", [(256, 4, False), (256, 3, False), (128, 6, False), (256, 4, True),
                                                  (128, 5, True)])
def test_clustered_gemm_on_gpu(dtype, bn, stages, persistent, poisoned):
    """The TMA GEMM in 2-block clusters (W's tile multicast), against float64 into NaN-filled
    outputs; persistent: the last shape has more tiles than an H100 or H200 has SMs, so each
    cluster walks several pairs of tiles (the buffers' rounds run on across them)."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_tma import TmaLinear

    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    lin = TmaLinear(dtype, bn, stages, persistent=persistent, cluster=2)
    gen = torch.Generator(device="cuda").manual_seed(bn + stages)
    for m, n, k in ((256, bn, 64), (512, 3 * bn, 320), (1024, 1024, 2048), (4096, 2048, 512)):
        a = torch.randn(m, k, device="cuda", dtype=tdt, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=tdt, generator=gen)
        c = lin(a, w)
        ref = a.double() @ w.double().t()
        err = float(torch.linalg.norm((c.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
        assert err < (2e-3 if dtype == "f16" else 1e-2), (m, n, k, err)
