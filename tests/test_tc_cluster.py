"""Thread-block clusters and TMA multicast in pnex, without a GPU: ``jit(cluster_dims=...)``
puts the cluster directives in the code and refuses what the GPU cannot launch (a grid
that is not whole clusters, a GPU before sm_90, a rank or mask outside the cluster); the
simulator runs a cluster's blocks at once, multicast copies land in every block of the
mask, remote arrivals complete the other block's barrier; the primitives and the
clustered GEMM compile to the instructions (PTX and SASS where the toolchain is here)."""

import sys
from pathlib import Path

import pytest
import torch
from numba import cuda, uint64
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc
from pnex_magic.errors import ArgumentShapeError, KernelDefinitionError, KernelLaunchError

REPO = Path(__file__).resolve().parents[1]


@pnex.jit(n_threads=("x.size(1)", "x.size(0)"), threads_per_block=(32, 1), cluster_dims=(2, 2))
def ranks(x: pnex.In("f32", (None, None)), out: pnex.Out("i32", (4, 4), init=-1)):
    """Block (bx, by)'s rank in its 2 x 2 cluster, written by its thread 0 at [by, bx]."""
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.y, cuda.blockIdx.x] = tc.cluster_ctarank()


@pnex.jit(n_threads=("4 * 64",), threads_per_block=64, cluster_dims=2)
def halves(src: pnex.In("f16", (None, None)), desc: pnex.In("uint8", (128,)), out: pnex.Out("f16", (4, 16, 64))):
    """Each block of a pair loads half of a 16 x 64 box (8 rows, the map's box) and
    multicasts it to both; each block also tells both that it is done (a barrier of 2
    remote arrivals) before the cluster exits.  Pair p holds rows 16 p.. of ``src``."""
    tile = cuda.shared.array((16, 64), float16, alignment=1024)
    bars = cuda.shared.array(2, uint64, alignment=8)
    tid = cuda.threadIdx.x
    rank = tc.cluster_ctarank()
    if tid == 0:
        tc.mbarrier_init(bars, 0, 1)
        tc.mbarrier_init(bars, 1, 2)
        tc.fence_mbarrier_init_cluster()
    tc.cluster_sync()
    if tid == 0:
        tc.tensor_map_acquire(desc)
        tc.mbarrier_arrive_expect_tx(bars, 0, 16 * 64 * 2)  # both halves land here
        row = 16 * (cuda.blockIdx.x // 2) + 8 * rank
        tc.tma_load_multicast(tile, (8 * rank, 0), desc, (row, 0), bars, 0, 3)
    tc.mbarrier_wait(bars, 0, 0)
    for i in range(tid, 16 * 64, 64):
        r = i // 64
        c = i % 64
        out[cuda.blockIdx.x, r, c] = tile[r, tc.swizzle(r, c, 64)]
    if tid == 0:
        tc.mbarrier_arrive_cluster(bars, 1, 0)
        tc.mbarrier_arrive_cluster(bars, 1, 1)
    tc.mbarrier_wait(bars, 1, 0)
    tc.cluster_sync()


@pnex.jit(n_threads=(64,), threads_per_block=32, cluster_dims=2)
def ping_pong(out: pnex.Out("i32", (2,)), n: pnex.Scalar("int32")):
    """``n`` rounds of a token passed between the blocks' threads 0: rank 0 arrives on rank
    1's barrier and waits on its own, rank 1 waits on its own and arrives on rank 0's (so
    neither can complete a phase of the other's barrier before the other has seen the
    previous one: arriving first on both sides lets one run a phase ahead, and the other
    then waits on a parity that has come round again, a hang the simulator reports)."""
    bars = cuda.shared.array(1, uint64, alignment=8)
    rank = tc.cluster_ctarank()
    if cuda.threadIdx.x == 0:
        tc.mbarrier_init(bars, 0, 1)
    tc.cluster_sync()
    seen = 0
    if cuda.threadIdx.x == 0:
        for r in range(n):
            if rank == 0:
                tc.mbarrier_arrive_cluster(bars, 0, 1)
            tc.mbarrier_wait(bars, 0, r & 1)
            if rank == 1:
                tc.mbarrier_arrive_cluster(bars, 0, 0)
            seen += 1
        out[rank] = seen
    tc.cluster_sync()


def test_cluster_ranks_count_x_fastest():
    out = ranks(torch.zeros(4, 4 * 32))
    assert out.tolist() == [[0, 1, 0, 1], [2, 3, 2, 3]] * 2


def test_multicast_lands_in_every_block_of_the_mask():
    src = torch.randn(32, 64, generator=torch.Generator().manual_seed(5)).half()
    out = halves(src, tc.tensor_map(src, (8, 64)))
    for block in range(4):
        assert torch.equal(out[block], src[16 * (block // 2):16 * (block // 2) + 16]), block


def test_remote_arrivals_complete_the_other_blocks_phases():
    assert ping_pong(5).tolist() == [5, 5]


def test_a_grid_of_partial_clusters_is_refused_naming_both():
    with pytest.raises(ArgumentShapeError, match=r"ranks\(\): the grid \(3 x 4 x 1 blocks\).*cluster_dims=\(2, 2, 1\) "
                                                 r"\(x: 3 blocks, not a multiple of 2\)"):
        ranks(torch.zeros(4, 3 * 32))
    with pytest.raises(ArgumentShapeError, match=r"y: 3 blocks, not a multiple of 2"):
        ranks(torch.zeros(3, 4 * 32))


@pytest.mark.parametrize("dims,match", [
    (0, "1 to 3 positive ints"), ((2, 0), "1 to 3 positive ints"), ((1, 1, 1, 1), "1 to 3 positive ints"),
    (True, "1 to 3 positive ints"), ((3, 3), "9 blocks a cluster; at most 8"), ((1, 1, 2), "groups blocks along z"),
])
def test_bad_cluster_dims_are_refused_at_definition(dims, match):
    with pytest.raises(KernelDefinitionError, match=match):
        @pnex.jit(n_threads=("x.size(1)", "x.size(0)"), threads_per_block=(32, 1), cluster_dims=dims)
        def k(x: pnex.In("f32", (None, None)), out: pnex.Out("f32", "x")):
            out[0, 0] = x[0, 0]


def test_clusters_need_hopper():
    with pytest.raises(KernelDefinitionError, match=r"thread-block clusters \(cluster_dims=\(2, 2, 1\)\), which need "
                                                    r"sm_90 or newer .* cannot be compiled for sm_80"):
        pnex.inspect(ranks, arch="sm_80")


def test_ranks_outside_the_cluster_are_refused():
    """A constant mask or rank: at definition, from the source, naming the line; one the
    kernel computes: by the simulator (the GPU's behaviour is undefined)."""
    @pnex.jit(n_threads=(64,), threads_per_block=32, cluster_dims=2)
    def masked(src: pnex.In("f16", (None, None)), desc: pnex.In("uint8", (128,)), out: pnex.Out("f16", (16, 64)),
               mask: pnex.Scalar("int32")):
        tile = cuda.shared.array((16, 64), float16, alignment=1024)
        bars = cuda.shared.array(1, uint64, alignment=8)
        if cuda.threadIdx.x == 0:
            tc.mbarrier_init(bars, 0, 1)
            tc.mbarrier_arrive_expect_tx(bars, 0, 2048)
            tc.tma_load_multicast(tile, (0, 0), desc, (0, 0), bars, 0, mask)

    src = torch.zeros(16, 64).half()
    with pytest.raises(KernelLaunchError, match=r"tma_load_multicast: cta_mask 0b101 names CTA rank 2, outside the "
                                                r"cluster \(cluster_dims=\(2, 1, 1\): 2 blocks, ranks 0 to 1\)"):
        masked(src, tc.tensor_map(src, (16, 64)), 0b101)

    for mask, match in ((0b101, r"cta_mask 0b101 names CTA rank 2, outside its cluster of 2 blocks"),
                        (0, r"cta_mask 0x0 must name 1 to 16 CTA ranks")):
        with pytest.raises(KernelDefinitionError, match=r"kernel 'constant', line \d+: pnex\.tc\.tma_load_multicast's "
                                                        + match):
            @pnex.jit(n_threads=(64,), threads_per_block=32, cluster_dims=2)
            def constant(src: pnex.In("f16", (None, None)), desc: pnex.In("uint8", (128,)),
                         out: pnex.Out("f16", (16, 64))):
                tile = cuda.shared.array((16, 64), float16, alignment=1024)
                bars = cuda.shared.array(1, uint64, alignment=8)
                tc.tma_load_multicast(tile, (0, 0), desc, (0, 0), bars, 0, mask)

            pnex.inspect(constant, arch="sm_90")

    @pnex.jit(n_threads=(32,), threads_per_block=32)
    def lonely(out: pnex.Out("f32", (32,)), rank: pnex.Scalar("int32")):
        bars = cuda.shared.array(1, uint64, alignment=8)
        if cuda.threadIdx.x == 0:
            tc.mbarrier_init(bars, 0, 1)
            tc.mbarrier_arrive_cluster(bars, 0, rank)

    with pytest.raises(KernelLaunchError, match=r"CTA rank 1 is outside the cluster \(a launch without cluster_dims "
                                                r"is a cluster of 1 block"):
        lonely(1)

    with pytest.raises(KernelDefinitionError, match=r"mbarrier_arrive_cluster's rank 1 names CTA rank 1, outside its "
                                                    r"cluster of 1 block"):
        @pnex.jit(n_threads=(32,), threads_per_block=32)
        def lonely_constant(out: pnex.Out("f32", (32,))):
            bars = cuda.shared.array(1, uint64, alignment=8)
            tc.mbarrier_arrive_cluster(bars, 0, 1)

        pnex.inspect(lonely_constant, arch="sm_90")


def test_cluster_dims_are_in_the_cache_key_and_saved_artifacts():
    from pnex_magic.artifact.manifest import _spec, _spec_json
    from pnex_magic.report import _definition_of

    spec = _definition_of(ranks, "test").spec
    assert "cluster_dims=(2, 2, 1)" in spec.describe()
    assert _spec(_spec_json(spec)).cluster_dims == (2, 2, 1)
    plain = _definition_of(pnex.jit(n_threads=(32,), threads_per_block=32)(_plain_kernel), "test").spec
    assert "cluster_dims" not in plain.describe() and "cluster_dims" not in _spec_json(plain)


def _plain_kernel(out: pnex.Out("f32", (32,))):
    out[cuda.threadIdx.x] = 1.0


def _compiled(op):
    from pnex_magic.report import _definition_of

    compiled = _definition_of(op, "test").compiled("sm_90")
    if compiled.cubin is None:
        pytest.skip("no nvJitLink")
    return compiled


def test_cluster_kernel_compiles_to_the_directives_and_instructions():
    compiled = _compiled(halves)
    for text in (".explicitcluster", ".reqnctapercluster 2, 1, 1", "%cluster_ctarank",
                 "barrier.cluster.arrive;", "barrier.cluster.wait;", "fence.mbarrier_init.release.cluster;",
                 "mapa.shared::cluster.u32", "mbarrier.arrive.shared::cluster.b64",
                 "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"):
        assert text in compiled.ptx, text
    assert ".reqnctapercluster 2, 2, 1" in _compiled(ranks).ptx


def _gemm(cluster, bn=128, stages=2):
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_tma import TmaLinear

    return TmaLinear("f16", bn, stages, cluster=cluster)


def test_clustered_gemm_compiles_to_multicast_and_does_not_spill():
    compiled = _compiled(_gemm(2, 256, 4).op)
    assert ".reqnctapercluster 2, 1, 1" in compiled.ptx and ".maxntid 384" in compiled.ptx
    assert compiled.resources.local_bytes == 0
    from pnex_magic import sass

    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump/nvdisasm (the sass extra)")
    text = sass.disassemble(compiled.cubin, entry=compiled.entry).text
    for instruction in ("UTMALDG.2D.MULTICAST", "HGMMA.64x256x16.F32", "SYNCS.ARRIVE.TRANS64.RED", "UCGABAR_WAIT"):
        assert instruction in text, instruction
    assert "C7509" not in compiled.link_log  # no serialised wgmma
    # The consumers' k-loop (the last wgmma to the last remote arrival) holds no memory barrier:
    # with .release.cluster arrivals ptxas put MEMBAR.ALL.GPU before each, and the kernel ran at
    # half the plain one's rate on an H100.
    lines = text.splitlines()
    last_mma = max(i for i, line in enumerate(lines) if "HGMMA" in line)
    last_arrive = max(i for i, line in enumerate(lines) if "SYNCS.ARRIVE.TRANS64.RED" in line)
    loop = lines[min(last_mma, last_arrive):max(last_mma, last_arrive) + 1]
    assert not [line for line in loop if "MEMBAR" in line], "a memory barrier in the consumers' k-loop"


def test_clustered_gemm_on_cpu():
    """Two blocks of one cluster, 3 k-tiles through 2 buffers: the producers' third copy
    waits for the empty barrier, which the consumers of both blocks release (16 arrivals,
    8 of them remote); each block holds W's tile from both producers' multicasts."""
    gen = torch.Generator().manual_seed(37)
    a = torch.randn(256, 192, generator=gen).half()
    w = torch.randn(64, 192, generator=gen).half()
    c = _gemm(2, 64)(a, w)
    ref = a.double() @ w.double().t()
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 1e-3).all()
    with pytest.raises(ArgumentShapeError, match=r"\(a.size\(0\) = 128\): M must be a multiple of the cluster's 2 block "
                                                 r"tiles BM = 256"):
        _gemm(2, 64)(a[:128], w)
