"""Hopper's Tensor Memory Accelerator on the GPU: bulk tensor copies (``cp.async.bulk.tensor``)
and the shared-memory barriers that count their bytes (``mbarrier``), as Numba intrinsics
emitting one PTX instruction each, like :mod:`.lowering`'s (whose helpers they take).

A copy is issued by one thread, moves a whole box of a 2-D tensor (a tensor map made on
the host, :func:`pnex_magic.tc.tensor_map`) into a shared tile in the 128-byte swizzled
layout ``wgmma`` reads, and signals a barrier with the bytes it wrote; the threads that
read the tile wait on the barrier's phase.  No thread computes an address or issues a
load per 16 bytes, and a producer warp can run ahead of the warpgroups that compute.
"""

from __future__ import annotations

from typing import Any, Callable

from . import api as tc

__all__ = ["register_bulk"]


def register_bulk(*, literal: Callable, is_index: Callable, index_values: Callable, element_pointer: Callable,
                  shared_address: Callable, subscripts_error: Callable) -> None:
    """Register the bulk-copy and barrier intrinsics (once, from :func:`.lowering.register_cuda`)."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.core.errors import TypingError
    from numba.cuda.extending import intrinsic, overload

    i32, i64 = ir.IntType(32), ir.IntType(64)
    void = ir.VoidType()

    def barrier_error(name: str, bars: Any, index: Any) -> str | None:
        if not isinstance(bars, types.Array) or bars.ndim != 1 or bars.dtype not in (types.uint64, types.int64):
            return (f"pnex.tc.{name}: the barriers must be a 1-D shared array of uint64 (one 8-byte mbarrier each), "
                    f"got {bars}")
        if not bars.mutable:
            return f"pnex.tc.{name}: the barriers are read-only"
        if not isinstance(index, types.Integer):
            return f"pnex.tc.{name}: the barrier's index must be an integer, got {index}"
        return None

    def barrier_address(context: Any, builder: Any, bars_ty: Any, bars: Any, index_ty: Any, index: Any) -> Any:
        where = element_pointer(context, builder, bars_ty, bars, index_values(context, builder, index_ty, index))
        return shared_address(builder, where)

    def as_i32(context: Any, builder: Any, value: Any, ty: Any) -> Any:
        return context.cast(builder, value, ty, types.int32)

    # ---- mbarrier ------------------------------------------------------------------------------------

    @intrinsic
    def _init(typingctx, bars, index, count):
        problem = barrier_error("mbarrier_init", bars, index)
        if problem:
            raise TypingError(problem)
        if not isinstance(count, types.Integer):
            raise TypingError(f"pnex.tc.mbarrier_init: the arrival count must be an integer, got {count}")

        def codegen(context, builder, signature, args):
            bars_ty, index_ty, count_ty = signature.args
            address = barrier_address(context, builder, bars_ty, args[0], index_ty, args[1])
            arrivals = as_i32(context, builder, args[2], count_ty)
            builder.asm(ir.FunctionType(void, [i32, i32]),
                        "mbarrier.init.shared::cta.b64 [$0], $1;\nfence.mbarrier_init.release.cluster;",
                        "r,r,~{memory}", [address, arrivals], True)
            return context.get_dummy_value()

        return types.none(bars, index, count), codegen

    @intrinsic
    def _arrive(typingctx, bars, index):
        problem = barrier_error("mbarrier_arrive", bars, index)
        if problem:
            raise TypingError(problem)

        def codegen(context, builder, signature, args):
            address = barrier_address(context, builder, signature.args[0], args[0], signature.args[1], args[1])
            builder.asm(ir.FunctionType(void, [i32]), "mbarrier.arrive.shared::cta.b64 _, [$0];", "r,~{memory}",
                        [address], True)
            return context.get_dummy_value()

        return types.none(bars, index), codegen

    @intrinsic
    def _expect(typingctx, bars, index, nbytes):
        problem = barrier_error("mbarrier_arrive_expect_tx", bars, index)
        if problem:
            raise TypingError(problem)
        if not isinstance(nbytes, types.Integer):
            raise TypingError(f"pnex.tc.mbarrier_arrive_expect_tx: the byte count must be an integer, got {nbytes}")

        def codegen(context, builder, signature, args):
            bars_ty, index_ty, nbytes_ty = signature.args
            address = barrier_address(context, builder, bars_ty, args[0], index_ty, args[1])
            count = as_i32(context, builder, args[2], nbytes_ty)
            builder.asm(ir.FunctionType(void, [i32, i32]), "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
                        "r,r,~{memory}", [address, count], True)
            return context.get_dummy_value()

        return types.none(bars, index, nbytes), codegen

    @intrinsic
    def _wait(typingctx, bars, index, parity):
        problem = barrier_error("mbarrier_wait", bars, index)
        if problem:
            raise TypingError(problem)
        if not isinstance(parity, (types.Integer, types.Boolean)):
            raise TypingError(f"pnex.tc.mbarrier_wait: the phase parity must be 0 or 1, got {parity}")

        def codegen(context, builder, signature, args):
            bars_ty, index_ty, parity_ty = signature.args
            address = barrier_address(context, builder, bars_ty, args[0], index_ty, args[1])
            bit = builder.and_(context.cast(builder, args[2], parity_ty, types.int32), ir.Constant(i32, 1))
            # try_wait suspends for a while in hardware; the loop retries until the phase completes
            asm = ("{\n.reg .pred done;\nwait_again:\n"
                   "mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\n"
                   "@!done bra wait_again;\n}")
            builder.asm(ir.FunctionType(void, [i32, i32]), asm, "r,r,~{memory}", [address, bit], True)
            return context.get_dummy_value()

        return types.none(bars, index, parity), codegen

    @overload(tc.mbarrier_init, target="cuda")
    def _init_impl(bars, index, count):
        return lambda bars, index, count: _init(bars, index, count)

    @overload(tc.mbarrier_arrive, target="cuda")
    def _arrive_impl(bars, index):
        return lambda bars, index: _arrive(bars, index)

    @overload(tc.mbarrier_arrive_expect_tx, target="cuda")
    def _expect_impl(bars, index, nbytes):
        return lambda bars, index, nbytes: _expect(bars, index, nbytes)

    @overload(tc.mbarrier_wait, target="cuda")
    def _wait_impl(bars, index, parity):
        return lambda bars, index, parity: _wait(bars, index, parity)

    # ---- bulk tensor copies ----------------------------------------------------------------------------

    def map_error(name: str, desc: Any) -> str | None:
        if not isinstance(desc, types.Array) or desc.ndim != 1 or desc.dtype != types.uint8:
            return (f"pnex.tc.{name}: the tensor map must be the 1-D uint8 tensor pnex.tc.tensor_map() made "
                    f"(a parameter annotated pnex.In('uint8', (128,))), got {desc}")
        return None

    def map_address(context: Any, builder: Any, desc_ty: Any, desc: Any) -> Any:
        return builder.ptrtoint(element_pointer(context, builder, desc_ty, desc, [ir.Constant(i64, 0)]), i64)

    @intrinsic
    def _tma_load(typingctx, tile, index, desc, coords, bars, bar_index):
        if not is_index(index) or not (isinstance(coords, types.BaseTuple) and len(coords) == 2
                                       and all(isinstance(t, types.Integer) for t in coords)):
            raise TypingError(f"pnex.tc.tma_load: the coordinates must be a (row, column) pair of integers, got {coords}")
        if not isinstance(tile, types.Array) or not tile.mutable:
            raise TypingError(f"pnex.tc.tma_load: the destination must be a writable shared array, got {tile}")
        for problem in (subscripts_error("tma_load", tile, index, "tile"), map_error("tma_load", desc),
                        barrier_error("tma_load", bars, bar_index)):
            if problem:
                raise TypingError(problem)

        def codegen(context, builder, signature, args):
            tile_ty, index_ty, desc_ty, coords_ty, bars_ty, bar_index_ty = signature.args
            where = element_pointer(context, builder, tile_ty, args[0], index_values(context, builder, index_ty, args[1]))
            row, col = [as_i32(context, builder, v, t)
                        for v, t in zip(index_values(context, builder, coords_ty, args[3]), (types.intp, types.intp))]
            bar = barrier_address(context, builder, bars_ty, args[4], bar_index_ty, args[5])
            asm = ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                   "[$0], [$1, {$2, $3}], [$4];")  # coordinates innermost first: column, row
            builder.asm(ir.FunctionType(void, [i32, i64, i32, i32, i32]), asm, "r,l,r,r,r,~{memory}",
                        [shared_address(builder, where), map_address(context, builder, desc_ty, args[2]), col, row, bar],
                        True)
            return context.get_dummy_value()

        return types.none(tile, index, desc, coords, bars, bar_index), codegen

    @intrinsic
    def _acquire(typingctx, desc):
        problem = map_error("tensor_map_acquire", desc)
        if problem:
            raise TypingError(problem)

        def codegen(context, builder, signature, args):
            address = map_address(context, builder, signature.args[0], args[0])
            builder.asm(ir.FunctionType(void, [i64]),
                        "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;\nprefetch.tensormap [$0];",
                        "l,~{memory}", [address], True)
            return context.get_dummy_value()

        return types.none(desc), codegen

    @overload(tc.tma_load, target="cuda")
    def _tma_load_impl(tile, index, desc, coords, bars, bar_index):
        return lambda tile, index, desc, coords, bars, bar_index: _tma_load(tile, index, desc, coords, bars, bar_index)

    @overload(tc.tensor_map_acquire, target="cuda")
    def _acquire_impl(desc):
        return lambda desc: _acquire(desc)

    # ---- named barriers --------------------------------------------------------------------------------

    @intrinsic
    def _bar_sync(typingctx, index, threads):
        if not isinstance(index, types.Integer) or not isinstance(threads, types.Integer):
            raise TypingError(f"pnex.tc.named_barrier: the barrier's index and thread count must be integers, got "
                              f"{index} and {threads}")

        def codegen(context, builder, signature, args):
            ident = as_i32(context, builder, args[0], signature.args[0])
            count = as_i32(context, builder, args[1], signature.args[1])
            builder.asm(ir.FunctionType(void, [i32, i32]), "bar.sync $0, $1;", "r,r,~{memory}", [ident, count], True)
            return context.get_dummy_value()

        return types.none(index, threads), codegen

    @overload(tc.named_barrier, target="cuda")
    def _bar_sync_impl(index, threads):
        return lambda index, threads: _bar_sync(index, threads)

    # ---- register budgets -------------------------------------------------------------------------------

    def maxnreg(direction: str):
        @intrinsic
        def _setmaxnreg(typingctx, count):
            n = literal(count)
            if not isinstance(n, int):
                raise TypingError(f"pnex.tc.setmaxnreg_{direction}: the register count must be a constant, got {count}")
            if n % 8 or not 24 <= n <= 256:
                raise TypingError(f"pnex.tc.setmaxnreg_{direction}: the register count must be a multiple of 8 from "
                                  f"24 to 256, got {n}")

            def codegen(context, builder, signature, args):
                builder.asm(ir.FunctionType(void, []), f"setmaxnreg.{direction}.sync.aligned.u32 {n};", "~{memory}",
                            [], True)
                return context.get_dummy_value()

            return types.none(count), codegen
        return _setmaxnreg

    _inc, _dec = maxnreg("inc"), maxnreg("dec")

    @overload(tc.setmaxnreg_inc, target="cuda", prefer_literal=True)
    def _inc_impl(count):
        return lambda count: _inc(count)

    @overload(tc.setmaxnreg_dec, target="cuda", prefer_literal=True)
    def _dec_impl(count):
        return lambda count: _dec(count)

    # ---- thread-block clusters ------------------------------------------------------------------------

    i16 = ir.IntType(16)

    @intrinsic
    def _ctarank(typingctx):
        def codegen(context, builder, signature, args):
            return builder.asm(ir.FunctionType(i32, []), "mov.u32 $0, %cluster_ctarank;", "=r", [], False)

        return types.int32(), codegen

    @intrinsic
    def _cluster_sync(typingctx):
        def codegen(context, builder, signature, args):
            # not .aligned: the threads of a warp may reach it from different places (branches)
            builder.asm(ir.FunctionType(void, []), "barrier.cluster.arrive;\nbarrier.cluster.wait;",
                        "~{memory}", [], True)
            return context.get_dummy_value()

        return types.none(), codegen

    @intrinsic
    def _fence_init(typingctx):
        def codegen(context, builder, signature, args):
            builder.asm(ir.FunctionType(void, []), "fence.mbarrier_init.release.cluster;", "~{memory}", [], True)
            return context.get_dummy_value()

        return types.none(), codegen

    # (a constant rank or mask outside the kernel's clusters is refused before this, from the
    # source: pnex_magic.tc.usage.cluster_rank_problem; Numba retries a literal refused here as an int)
    def rank_error(name: str, rank: Any) -> str | None:
        if not isinstance(rank, types.Integer):
            return f"pnex.tc.{name}: the CTA rank must be an integer, got {rank}"
        return None

    @intrinsic
    def _arrive_cluster(typingctx, bars, index, rank):
        for problem in (barrier_error("mbarrier_arrive_cluster", bars, index), rank_error("mbarrier_arrive_cluster", rank)):
            if problem:
                raise TypingError(problem)

        def codegen(context, builder, signature, args):
            bars_ty, index_ty, rank_ty = signature.args
            address = barrier_address(context, builder, bars_ty, args[0], index_ty, args[1])
            target = as_i32(context, builder, args[2], rank_ty)
            # The default semantics (.release at .cta scope), as CUTLASS's ClusterBarrier::arrive
            # writes it: with .release.cluster, ptxas put MEMBAR.ALL.GPU (and CGAERRBAR) before
            # every arrival, in the consumers' k-loop of the clustered GEMM, which then ran at half
            # the plain kernel's rate on an H100.
            asm = ("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, $0, $1;\n"
                   "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}")
            builder.asm(ir.FunctionType(void, [i32, i32]), asm, "r,r,~{memory}", [address, target], True)
            return context.get_dummy_value()

        return types.none(bars, index, rank), codegen

    @intrinsic
    def _tma_multicast(typingctx, tile, index, desc, coords, bars, bar_index, mask):
        if not is_index(index) or not (isinstance(coords, types.BaseTuple) and len(coords) == 2
                                       and all(isinstance(t, types.Integer) for t in coords)):
            raise TypingError(f"pnex.tc.tma_load_multicast: the coordinates must be a (row, column) pair of integers, "
                              f"got {coords}")
        if not isinstance(tile, types.Array) or not tile.mutable:
            raise TypingError(f"pnex.tc.tma_load_multicast: the destination must be a writable shared array, got {tile}")
        if not isinstance(mask, types.Integer):
            raise TypingError(f"pnex.tc.tma_load_multicast: cta_mask must be an integer (bit r: CTA rank r), got {mask}")
        for problem in (subscripts_error("tma_load_multicast", tile, index, "tile"),
                        map_error("tma_load_multicast", desc), barrier_error("tma_load_multicast", bars, bar_index)):
            if problem:
                raise TypingError(problem)

        def codegen(context, builder, signature, args):
            tile_ty, index_ty, desc_ty, coords_ty, bars_ty, bar_index_ty, mask_ty = signature.args
            where = element_pointer(context, builder, tile_ty, args[0], index_values(context, builder, index_ty, args[1]))
            row, col = [as_i32(context, builder, v, t)
                        for v, t in zip(index_values(context, builder, coords_ty, args[3]), (types.intp, types.intp))]
            bar = barrier_address(context, builder, bars_ty, args[4], bar_index_ty, args[5])
            bits = builder.trunc(as_i32(context, builder, args[6], mask_ty), i16)
            asm = ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                   "[$0], [$1, {$2, $3}], [$4], $5;")  # coordinates innermost first: column, row
            builder.asm(ir.FunctionType(void, [i32, i64, i32, i32, i32, i16]), asm, "r,l,r,r,r,h,~{memory}",
                        [shared_address(builder, where), map_address(context, builder, desc_ty, args[2]), col, row, bar,
                         bits], True)
            return context.get_dummy_value()

        return types.none(tile, index, desc, coords, bars, bar_index, mask), codegen

    @overload(tc.cluster_ctarank, target="cuda")
    def _ctarank_impl():
        return lambda: _ctarank()

    @overload(tc.cluster_sync, target="cuda")
    def _cluster_sync_impl():
        return lambda: _cluster_sync()

    @overload(tc.fence_mbarrier_init_cluster, target="cuda")
    def _fence_init_impl():
        return lambda: _fence_init()

    @overload(tc.mbarrier_arrive_cluster, target="cuda")
    def _arrive_cluster_impl(bars, index, rank):
        return lambda bars, index, rank: _arrive_cluster(bars, index, rank)

    @overload(tc.tma_load_multicast, target="cuda")
    def _tma_multicast_impl(tile, index, desc, coords, bars, bar_index, cta_mask):
        return lambda tile, index, desc, coords, bars, bar_index, cta_mask: _tma_multicast(
            tile, index, desc, coords, bars, bar_index, cta_mask)
