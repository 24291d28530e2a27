"""Hopper's bulk tensor copies (TMA) and mbarriers in pnex.tc, without a GPU: the
simulator's copy is the tensor's box in the 128-byte swizzle (zeros outside), its
barriers count arrivals and bytes as the PTX ISA says, a wait nothing can end is an
error instead of a hang, and the GPU lowering types, refuses and compiles (to PTX and
SASS where the toolchain is installed)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from numba import cuda, uint64
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc
from pnex_magic.errors import KernelDefinitionError, KernelLaunchError, KernelTypingError

REPO = Path(__file__).resolve().parents[1]
ROWS, COLS = 16, 64


@pnex.jit(n_threads=(32,), threads_per_block=32)
def tma_box(
    src: pnex.In("f16", (None, None)),
    desc: pnex.In("uint8", (128,)),
    out: pnex.Out("f16", (16, 64)),
    row: pnex.Scalar("int32"),
    col: pnex.Scalar("int32"),
):
    tile = cuda.shared.array((16, 64), float16, alignment=1024)
    bars = cuda.shared.array(1, uint64, alignment=8)
    tid = cuda.threadIdx.x
    if tid == 0:
        tc.mbarrier_init(bars, 0, 1)
    cuda.syncthreads()
    if tid == 0:
        tc.tensor_map_acquire(desc)
        tc.mbarrier_arrive_expect_tx(bars, 0, 16 * 64 * 2)
        tc.tma_load(tile, (0, 0), desc, (row, col), bars, 0)
    tc.mbarrier_wait(bars, 0, 0)
    for i in range(tid, 16 * 64, 32):
        r = i // 64
        c = i % 64
        out[r, c] = tile[r, tc.swizzle(r, c, 64)]


@pnex.jit(n_threads=(32,), threads_per_block=32)
def never_arrives(out: pnex.Out("f32", (32,))):
    bars = cuda.shared.array(1, uint64, alignment=8)
    if cuda.threadIdx.x == 0:
        tc.mbarrier_init(bars, 0, 2)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        tc.mbarrier_arrive(bars, 0)  # one of the two arrivals the phase needs
    tc.mbarrier_wait(bars, 0, 0)
    out[cuda.threadIdx.x] = 1.0


@pnex.jit(n_threads=(32,), threads_per_block=32)
def rounds(start: pnex.In("i32", (32,)), out: pnex.Out("i32", (32,)), n: pnex.Scalar("int32")):
    """Thread 0 arrives on barrier 0 once a round and waits for the warp's 31 others on
    barrier 1; every thread counts the rounds it saw complete, from ``start``."""
    bars = cuda.shared.array(2, uint64, alignment=8)
    tid = cuda.threadIdx.x
    if tid == 0:
        tc.mbarrier_init(bars, 0, 1)
        tc.mbarrier_init(bars, 1, 31)
    cuda.syncthreads()
    seen = start[tid]
    for r in range(n):
        if tid == 0:
            tc.mbarrier_arrive(bars, 0)
            tc.mbarrier_wait(bars, 1, r & 1)
        else:
            tc.mbarrier_wait(bars, 0, r & 1)
            tc.mbarrier_arrive(bars, 1)
        seen += 1
    out[tid] = seen


def box_reference(src: torch.Tensor, row: int, col: int) -> torch.Tensor:
    """The 16 x 64 box of ``src`` from (row, col), zeros outside."""
    out = torch.zeros(ROWS, COLS, dtype=src.dtype)
    r0, r1 = max(row, 0), min(row + ROWS, src.shape[0])
    c0, c1 = max(col, 0), min(col + COLS, src.shape[1])
    if r0 < r1 and c0 < c1:
        out[r0 - row:r1 - row, c0 - col:c1 - col] = src[r0:r1, c0:c1]
    return out


@pytest.mark.parametrize("row,col", [(0, 0), (8, 64), (40, 8), (-3, 0), (44, 104), (-20, 0)])
def test_tma_load_copies_the_box_in_the_swizzle_and_zeros_outside(row, col):
    gen = torch.Generator().manual_seed(row * 1000 + col)
    src = torch.randn(48, 160, generator=gen).half()
    out = tma_box(src, tc.tensor_map(src, (ROWS, COLS)), row, col)
    assert torch.equal(out, box_reference(src, row, col))


def test_a_column_off_16_bytes_is_refused_as_the_gpu_faults_on_it():
    """Found on an H100: a box from column 100 (200 bytes) stops the kernel with an illegal
    instruction and loses the CUDA context; the simulator says why instead."""
    src = torch.randn(48, 160).half()
    with pytest.raises(KernelLaunchError, match="not a multiple of 16 bytes"):
        tma_box(src, tc.tensor_map(src, (ROWS, COLS)), 0, 100)


def test_barrier_phases_alternate_over_rounds():
    out = rounds(torch.arange(32, dtype=torch.int32), 5)
    assert out.tolist() == [5 + i for i in range(32)]


def test_a_wait_no_arrival_can_end_is_an_error_not_a_hang():
    with pytest.raises(KernelLaunchError, match="would hang"):
        never_arrives()


def test_tensor_map_reads_the_tensor_it_was_made_for():
    a = torch.randn(16, 64).half()
    b = torch.randn(16, 64).half()
    assert torch.equal(tma_box(b, tc.tensor_map(a, (ROWS, COLS)), 0, 0), a)  # as the GPU: the map's tensor
    desc = tc.tensor_map(torch.randn(16, 64).half(), (ROWS, COLS))
    import gc

    gc.collect()
    with pytest.raises(KernelLaunchError, match="no longer exists"):
        tma_box(a, desc, 0, 0)


@pytest.mark.parametrize("tensor,box,swizzle,match", [
    (torch.zeros(4, 4, 4).half(), (4, 4), 128, "2-D"),
    (torch.zeros(64, 128).half(), (16, 128), 128, "wider than the 128-byte swizzle"),
    (torch.zeros(64, 128).half(), (300, 64), 128, "1 to 256"),
    (torch.zeros(64, 130).half()[:, :128], (16, 64), 128, "multiples of 16 bytes"),
    (torch.zeros(64, 128).half().t(), (16, 64), 128, "contiguous"),
    (torch.zeros(64, 128).half(), (16, 64), 48, "swizzle must be one of"),
    (torch.zeros(64, 128).half(), (16, 4), 0, "multiple of 16 bytes"),
])
def test_tensor_map_refuses_what_the_hardware_cannot_copy(tensor, box, swizzle, match):
    with pytest.raises(ValueError, match=match):
        tc.tensor_map(tensor, box, swizzle)


def test_tensor_map_is_kept_for_the_same_tensor():
    a = torch.randn(64, 64).half()
    assert tc.tensor_map(a, (16, 64)) is tc.tensor_map(a, (16, 64))
    assert tc.tensor_map(a, (16, 64)) is not tc.tensor_map(a, (32, 64))


def _gemm(persistent, cluster=1):
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_tma import TmaLinear

    return TmaLinear("f16", 128, 2, persistent=persistent, cluster=cluster)


@pytest.mark.parametrize("cluster", [1, 2])
def test_warp_specialised_gemm_example_on_cpu(cluster, poisoned):
    """The persistent kernel in the simulator: a producer warp feeding two consumer
    warpgroups through 2 buffers, 2 tiles a block of 2 k-tiles each (each buffer's
    barriers go round twice across the tiles; the output staged while the next loads).
    ``cluster=2``: the two blocks are one cluster and walk the pairs of tiles (0, 1) and
    (2, 3), each producer multicasting half of W's tile into both blocks, each consumer
    warp releasing the buffers of both.  The non-persistent kernel's loop is the same;
    the GPU test runs both."""
    gen = torch.Generator().manual_seed(31 + cluster)
    a = torch.randn(512, 128, generator=gen).half()
    w = torch.randn(128, 128, generator=gen).half()
    c = _gemm(True, cluster)(a, w)
    ref = a.double() @ w.double().t()
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 1e-3).all()


def test_tma_primitives_need_hopper():
    with pytest.raises(KernelDefinitionError, match=r"pnex\.tc\.(tma_load|mbarrier_\w+|tensor_map_acquire), which "
                                                    r"needs sm_90 .* cannot be compiled for sm_80"):
        pnex.inspect(tma_box, arch="sm_80")


def _compiled(op):
    from pnex_magic.report import _definition_of

    compiled = _definition_of(op, "test").compiled("sm_90")
    if compiled.cubin is None:
        pytest.skip("no nvJitLink")
    return compiled


def test_tma_kernel_compiles_to_the_bulk_copy_and_barriers():
    compiled = _compiled(tma_box)
    for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                        "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                        "fence.proxy.tensormap::generic.acquire.gpu"):
        assert instruction in compiled.ptx
    assert ".maxntid" not in compiled.ptx  # launch bounds only where registers move between warpgroups


def test_setmaxnreg_kernel_declares_its_block_and_does_not_spill():
    """ptxas gives the consumers the registers setmaxnreg names only with .maxntid: with a
    register cap instead, the 128 accumulators a thread spilled (4 KiB, measured)."""
    compiled = _compiled(_gemm(False).op)
    assert ".maxntid 384" in compiled.ptx
    assert compiled.resources.local_bytes == 0
    from pnex_magic import sass

    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump/nvdisasm (the sass extra)")
    text = sass.disassemble(compiled.cubin, entry=compiled.entry).text
    assert "UTMALDG.2D" in text and "HGMMA.64x128x16.F32" in text
    assert "C7509" not in compiled.link_log  # no serialised wgmma


def test_bad_operands_are_refused_at_definition():
    with pytest.raises(KernelTypingError, match="tensor map must be the 1-D uint8"):
        @pnex.jit(n_threads=(32,), threads_per_block=32)
        def bad_desc(src: pnex.In("f16", (None, None)), desc: pnex.In("f32", (32,)), out: pnex.Out("f16", (16, 64))):
            tile = cuda.shared.array((16, 64), float16, alignment=1024)
            bars = cuda.shared.array(1, uint64, alignment=8)
            tc.tma_load(tile, (0, 0), desc, (0, 0), bars, 0)

        pnex.inspect(bad_desc, arch="sm_90")

    with pytest.raises(KernelTypingError, match="1-D shared array of uint64"):
        @pnex.jit(n_threads=(32,), threads_per_block=32)
        def bad_bars(out: pnex.Out("f32", (32,))):
            bars = cuda.shared.array(1, float16)
            tc.mbarrier_init(bars, 0, 1)

        pnex.inspect(bad_bars, arch="sm_90")


def test_simulated_barrier_errors_name_the_primitive():
    @pnex.jit(n_threads=(32,), threads_per_block=32)
    def uninitialised(out: pnex.Out("f32", (32,))):
        bars = cuda.shared.array(1, uint64, alignment=8)
        bars[0] = 0
        cuda.syncthreads()
        tc.mbarrier_wait(bars, 0, 0)

    with pytest.raises(KernelLaunchError, match="was not initialised"):
        uninitialised()

    @pnex.jit(n_threads=(32,), threads_per_block=32)
    def misaligned(src: pnex.In("f16", (None, None)), desc: pnex.In("uint8", (128,)), out: pnex.Out("f16", (16, 64))):
        tile = cuda.shared.array((17, 64), float16, alignment=1024)
        bars = cuda.shared.array(1, uint64, alignment=8)
        if cuda.threadIdx.x == 0:
            tc.mbarrier_init(bars, 0, 1)
            tc.mbarrier_arrive_expect_tx(bars, 0, 2048)
            tc.tma_load(tile, (1, 0), desc, (0, 0), bars, 0)

    src = torch.zeros(16, 64).half()
    with pytest.raises(KernelLaunchError, match="1024-byte boundary"):
        misaligned(src, tc.tensor_map(src, (ROWS, COLS)))


def test_simulated_barrier_state_is_the_isa_s():
    """Arrivals and bytes in either order complete a phase; an arrival past the count while
    bytes are still due is refused."""
    from pnex_magic.tc import simulate_bulk as sb

    bars = np.zeros(1, np.uint64)
    sb.mbarrier_init(bars, 0, 2)
    assert sb._state(int(bars[0])) == (2, 2, 0, 0)
    with sb._CHANGED:
        sb._settle("test", bars, 0, 0, -64)  # the bytes land before they are expected
    sb.mbarrier_arrive_expect_tx(bars, 0, 64)
    assert sb._state(int(bars[0])) == (1, 2, 0, 0)
    sb.mbarrier_arrive(bars, 0)
    assert sb._state(int(bars[0])) == (2, 2, 0, 1)  # completed: rearmed, the phase flipped
    sb.mbarrier_arrive_expect_tx(bars, 0, 64)
    sb.mbarrier_arrive_expect_tx(bars, 0, 64)
    assert sb._state(int(bars[0])) == (0, 2, 128, 1)  # every arrival in, the bytes still due
    with pytest.raises(RuntimeError, match="more arrivals"):
        sb.mbarrier_arrive(bars, 0)


def test_profile_and_sanitize_children_make_the_tensor_maps_again(tmp_path):
    """--profile and --sanitize run the call again in a child process from saved copies of
    its tensors; a tensor map holds its tensor's address, so the child makes it again for
    its copy (found on an H100: the TMA GEMM's profile came back empty)."""
    from pnex_magic.tc.tensormap import maps_among, remake_maps

    a, w = torch.randn(128, 64).half(), torch.randn(256, 64).half()
    args = (a, w, tc.tensor_map(a, (128, 64)), tc.tensor_map(w, (256, 64), 128), 3)
    maps = maps_among(args)
    assert maps == {2: (0, 128, 64, 128), 3: (1, 256, 64, 128)}
    torch.save({"args": list(args), "maps": maps}, tmp_path / "args.pt")
    saved = torch.load(tmp_path / "args.pt", weights_only=True)
    copies = remake_maps(saved["args"], saved["maps"])
    assert torch.equal(tma_box(copies[0][:16], tc.tensor_map(copies[0][:16], (ROWS, COLS)), 0, 0), a[:16])
    from pnex_magic.tc.tensormap import source_of

    assert source_of(bytes(copies[2].numpy()), "test")[0] is copies[0]  # the copy's map, not the original's
    with pytest.raises(ValueError, match="argument 1 is a tensor map .* this call does not pass"):
        maps_among((a, tc.tensor_map(w, (256, 64))))


def _register_split(producer, consumers):
    """A block of 384 threads whose first warpgroup gives registers back to ``producer``
    and whose two others take ``consumers`` (the warp-specialised GEMMs' split)."""

    @pnex.jit(n_threads=("x.size(0)",), threads_per_block=384)
    def register_split(x: pnex.In("int32", (384,)), out: pnex.Out("int32", ("x.size(0)",))):
        tid = cuda.threadIdx.x
        if tid < 128:
            tc.setmaxnreg_dec(producer)
        else:
            tc.setmaxnreg_inc(consumers)
        out[tid] = x[tid]

    return register_split


def test_setmaxnreg_that_fits_the_block_runs():
    """128 x 40 + 256 x 232 = 64512 = 384 x 168: what the GEMMs ask."""
    assert _register_split(40, 232)(torch.arange(384, dtype=torch.int32)).tolist() == list(range(384))


def test_setmaxnreg_past_the_block_is_refused_not_hung():
    """128 x 32 + 256 x 240 = 65536 registers against the 384 x 168 = 64512 a block of 384
    threads is launched with: this split hung an H200 (the increase waits for registers
    nobody gives back); the simulator says so."""
    with pytest.raises(Exception, match=r"setmaxnreg_\w+: the warpgroups of a block of 384 threads ask for "
                                        r"128 x 32 \+ 128 x 240 \+ 128 x 240 = 65536 registers, but the block is "
                                        r"launched with at most 168 a thread \(384 x 168 = 64512\)"):
        _register_split(32, 240)(torch.arange(384, dtype=torch.int32))
