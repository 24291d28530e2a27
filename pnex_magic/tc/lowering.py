"""The tensor-core primitives on the GPU: Numba-CUDA intrinsics that emit one PTX
instruction each through LLVM inline assembly.

Fragments are Numba arrays (views of ``cuda.local.array``); the intrinsics read and
write their elements at constant offsets, so once loops over fragments are unrolled
(constant trip counts, as NVVM does) every fragment lives in registers: no call, no
local memory (the report's registers and local memory say so; ``tests/test_tc.py``
checks the SASS).  Shared-memory operands are addressed as ``tile[index]`` and turned
into the 32-bit shared-window address the instructions take.
"""

from __future__ import annotations

import functools
from typing import Any

from . import api as tc
from .bulk import register_bulk
from .collectives import register_collectives

__all__ = ["register_cuda"]


def _literal(value: Any) -> Any:
    """The compile-time value of a Numba type: a literal's, or a ``Tune`` parameter's
    (pnex passes those as omitted arguments with their value as the default)."""
    if hasattr(value, "literal_value"):
        return value.literal_value
    if type(value).__name__ == "Omitted":
        return value.value
    return None


@functools.lru_cache(maxsize=1)
def register_cuda() -> None:
    """Register the CUDA implementations of :mod:`pnex_magic.tc` with Numba (once; the
    compile stage calls it before it compiles a kernel)."""
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.core.errors import TypingError
    from numba.cuda.extending import intrinsic, overload

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

    # ---- helpers ----------------------------------------------------------------------------------

    def is_index(ty: Any) -> bool:
        return isinstance(ty, types.Integer) or (
            isinstance(ty, types.BaseTuple) and len(ty) > 0 and all(isinstance(t, types.Integer) for t in ty)
        )

    def index_values(context: Any, builder: Any, ty: Any, value: Any) -> list[Any]:
        items = cgutils.unpack_tuple(builder, value, len(ty)) if isinstance(ty, types.BaseTuple) else [value]
        tys = list(ty) if isinstance(ty, types.BaseTuple) else [ty]
        return [context.cast(builder, v, t, types.intp) for v, t in zip(items, tys)]

    def element_pointer(context: Any, builder: Any, aryty: Any, ary: Any, indices: list[Any]) -> Any:
        arr = context.make_array(aryty)(context, builder, ary)
        return cgutils.get_item_pointer(context, builder, aryty, arr, indices, wraparound=False)

    def fragment_pointers(context: Any, builder: Any, aryty: Any, ary: Any, count: int) -> list[Any]:
        return [element_pointer(context, builder, aryty, ary, [ir.Constant(i64, k)]) for k in range(count)]

    def shared_address(builder: Any, pointer: Any) -> Any:
        """The 32-bit shared-window address of a generic pointer into shared memory."""
        raw = builder.bitcast(pointer, ir.IntType(8).as_pointer())
        shared = builder.addrspacecast(raw, ir.IntType(8).as_pointer(3))
        return builder.ptrtoint(shared, i32)

    def as_i32(builder: Any, value: Any) -> Any:
        if isinstance(value.type, ir.IntType):
            return value if value.type.width == 32 else builder.trunc(value, i32)
        return builder.bitcast(value, i32)

    def subscripts_error(name: str, ary: Any, index: Any, what: str) -> str | None:
        ndim = len(index) if isinstance(index, types.BaseTuple) else 1
        if ndim != ary.ndim:
            return f"pnex.tc.{name}: {ndim} subscripts for the {ary.ndim}-D {what}"
        return None

    def fragment_error(name: str, ary: Any, dtypes: tuple, what: str) -> str | None:
        if not isinstance(ary, types.Array) or ary.ndim != 1:
            return f"pnex.tc.{name}: {what} must be a 1-D array view (e.g. acc[i, j] of a cuda.local.array), got {ary}"
        if ary.dtype not in dtypes:
            names = " or ".join(str(d) for d in dtypes)
            return f"pnex.tc.{name}: {what} must hold {names}, got {ary.dtype}"
        return None

    words = (types.uint32, types.int32)

    # ---- mma ---------------------------------------------------------------------------------------

    MMA_ASM = {
        "f16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "tf32": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    }

    @intrinsic
    def _mma(typingctx, acc, a, b, kind):
        k = _literal(kind)
        if k not in MMA_ASM:
            return None
        for ary, dtypes, what in ((acc, (types.float32,), "the accumulator"), (a, words, "the A fragment"),
                                  (b, words, "the B fragment")):
            problem = fragment_error(f"mma_{k}" if k != "f16" else "mma", ary, dtypes, what)
            if problem:
                raise TypingError(problem)
        if not acc.mutable:
            raise TypingError("pnex.tc.mma: the accumulator is read-only")

        def codegen(context, builder, signature, args):
            acc_ty, a_ty, b_ty, _ = signature.args
            acc_p = fragment_pointers(context, builder, acc_ty, args[0], 4)
            a_vals = [as_i32(builder, builder.load(p)) for p in fragment_pointers(context, builder, a_ty, args[1], 4)]
            b_vals = [as_i32(builder, builder.load(p)) for p in fragment_pointers(context, builder, b_ty, args[2], 2)]
            c_vals = [builder.load(p) for p in acc_p]
            asm = (f"{MMA_ASM[k]} {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};")
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            out = builder.asm(fnty, asm, "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3", a_vals + b_vals + c_vals, False)
            for i, p in enumerate(acc_p):
                builder.store(builder.extract_value(out, i), p)
            return context.get_dummy_value()

        return types.none(acc, a, b, kind), codegen

    def mma_overload(kind: str):
        def impl(acc, a, b):
            return lambda acc, a, b: _mma(acc, a, b, kind)
        return impl

    overload(tc.mma, target="cuda")(mma_overload("f16"))
    overload(tc.mma_bf16, target="cuda")(mma_overload("bf16"))
    overload(tc.mma_tf32, target="cuda")(mma_overload("tf32"))

    # ---- ldmatrix ----------------------------------------------------------------------------------

    @intrinsic
    def _ldmatrix(typingctx, frag, tile, index, count, trans):
        n, t = _literal(count), _literal(trans)
        if n not in (1, 2, 4) or t not in (True, False) or not is_index(index):
            return None
        problem = fragment_error("ldmatrix", frag, words, "the fragment")
        if problem:
            raise TypingError(problem)
        if not isinstance(tile, types.Array) or tile.dtype.bitwidth != 16:
            raise TypingError(f"pnex.tc.ldmatrix: the tile must be a shared array of 16-bit elements, got {tile}")
        problem = subscripts_error("ldmatrix", tile, index, "tile")
        if problem:
            raise TypingError(problem)

        def codegen(context, builder, signature, args):
            frag_ty, tile_ty, index_ty, _, _ = signature.args
            where = element_pointer(context, builder, tile_ty, args[1], index_values(context, builder, index_ty, args[2]))
            address = shared_address(builder, where)
            outs = ",".join(f"${i}" for i in range(n))
            asm = f"ldmatrix.sync.aligned.m8n8.x{n}{'.trans' if t else ''}.shared.b16 {{{outs}}}, [${n}];"
            ret = i32 if n == 1 else ir.LiteralStructType([i32] * n)
            fnty = ir.FunctionType(ret, [i32])
            out = builder.asm(fnty, asm, ",".join(["=r"] * n + ["r", "~{memory}"]), [address], True)
            values = [out] if n == 1 else [builder.extract_value(out, i) for i in range(n)]
            for v, p in zip(values, fragment_pointers(context, builder, frag_ty, args[0], n)):
                builder.store(v, p)
            return context.get_dummy_value()

        return types.none(frag, tile, index, count, trans), codegen

    @overload(tc.ldmatrix, target="cuda", prefer_literal=True)
    def _ldmatrix_impl(frag, tile, index, count=4, trans=False):
        return lambda frag, tile, index, count=4, trans=False: _ldmatrix(frag, tile, index, count, trans)

    # ---- cp.async ----------------------------------------------------------------------------------

    @intrinsic
    def _cp_async(typingctx, dst, dst_index, src, src_index, valid):
        if not (is_index(dst_index) and is_index(src_index)) or not isinstance(valid, (types.Boolean, types.Integer)):
            return None
        for ary, what in ((dst, "destination"), (src, "source")):
            if not isinstance(ary, types.Array):
                raise TypingError(f"pnex.tc.cp_async: the {what} must be an array, got {ary}")
        if not dst.mutable:
            raise TypingError("pnex.tc.cp_async: the destination is read-only")
        size, src_size = dst.dtype.bitwidth // 8, src.dtype.bitwidth // 8
        if size != src_size or 16 % size:
            raise TypingError(
                f"pnex.tc.cp_async: the destination holds {size}-byte elements ({dst.dtype}) and the source "
                f"{src_size}-byte ones ({src.dtype}); cp.async copies 16 bytes, so both must hold elements of one "
                f"size that divides 16"
            )
        for ary, index, what in ((dst, dst_index, "destination"), (src, src_index, "source")):
            problem = subscripts_error("cp_async", ary, index, what)
            if problem:
                raise TypingError(problem)

        def codegen(context, builder, signature, args):
            dst_ty, dst_index_ty, src_ty, src_index_ty, valid_ty = signature.args
            d = element_pointer(context, builder, dst_ty, args[0], index_values(context, builder, dst_index_ty, args[1]))
            s = element_pointer(context, builder, src_ty, args[2], index_values(context, builder, src_index_ty, args[3]))
            ok = context.cast(builder, args[4], valid_ty, types.boolean)
            size = builder.select(ok, ir.Constant(i32, 16), ir.Constant(i32, 0))
            source = builder.ptrtoint(s, i64)
            fnty = ir.FunctionType(ir.VoidType(), [i32, i64, i32])
            builder.asm(fnty, "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                        [shared_address(builder, d), source, size], True)
            return context.get_dummy_value()

        return types.none(dst, dst_index, src, src_index, valid), codegen

    @overload(tc.cp_async, target="cuda")
    def _cp_async_impl(dst, dst_index, src, src_index, valid=True):
        return lambda dst, dst_index, src, src_index, valid=True: _cp_async(dst, dst_index, src, src_index, valid)

    @intrinsic
    def _commit(typingctx):
        def codegen(context, builder, signature, args):
            builder.asm(ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;", "~{memory}", [], True)
            return context.get_dummy_value()
        return types.none(), codegen

    def wait_intrinsic(instruction: str):
        """``instruction N`` for the number of pending groups N, which PTX takes as an
        immediate: a constant emits it once; an integer known only after optimisation
        (arithmetic on a ``Tune`` parameter, ``STAGES - 2``) emits a switch over 0..7
        that LLVM folds to the one case (values outside clamp to 0 and 7: waiting
        for more groups is always safe)."""
        @intrinsic
        def _wait(typingctx, pending):
            n = _literal(pending)
            if isinstance(n, int):
                n = min(max(n, 0), 7)
            elif not isinstance(pending, types.Integer):
                return None

            def emit(builder: Any, count: int) -> None:
                builder.asm(ir.FunctionType(ir.VoidType(), []), f"{instruction} {count};", "~{memory}", [], True)

            def codegen(context, builder, signature, args):
                if isinstance(n, int):
                    emit(builder, n)
                    return context.get_dummy_value()
                value = context.cast(builder, args[0], signature.args[0], types.int64)
                value = builder.select(builder.icmp_signed("<", value, ir.Constant(i64, 0)), ir.Constant(i64, 0), value)
                value = builder.select(builder.icmp_signed(">", value, ir.Constant(i64, 7)), ir.Constant(i64, 7), value)
                done = builder.append_basic_block("wait.done")
                switch = builder.switch(value, done)
                for count in range(8):
                    block = builder.append_basic_block(f"wait.{count}")
                    switch.add_case(ir.Constant(i64, count), block)
                    builder.position_at_end(block)
                    emit(builder, count)
                    builder.branch(done)
                builder.position_at_end(done)
                return context.get_dummy_value()

            return types.none(pending), codegen
        return _wait

    _wait = wait_intrinsic("cp.async.wait_group")

    @overload(tc.cp_async_commit, target="cuda")
    def _commit_impl():
        return lambda: _commit()

    @overload(tc.cp_async_wait, target="cuda", prefer_literal=True)
    def _wait_impl(pending):
        if not isinstance(_literal(pending), int) and not isinstance(pending, types.Integer):
            raise TypingError(f"pnex.tc.cp_async_wait: the number of pending groups must be an integer, got {pending}")
        return lambda pending: _wait(pending)

    # ---- packing -----------------------------------------------------------------------------------

    def pack_overload(conversion: str):
        @intrinsic
        def _pack(typingctx, lo, hi):
            if not (isinstance(lo, (types.Float, types.Integer)) and isinstance(hi, (types.Float, types.Integer))):
                return None

            def codegen(context, builder, signature, args):
                lo_v = context.cast(builder, args[0], signature.args[0], types.float32)
                hi_v = context.cast(builder, args[1], signature.args[1], types.float32)
                fnty = ir.FunctionType(i32, [f32, f32])
                # cvt.rn.{f16x2,bf16x2}.f32 d, a, b puts a in the upper half, b in the lower
                return builder.asm(fnty, f"cvt.rn.{conversion}.f32 $0, $1, $2;", "=r,f,f", [hi_v, lo_v], False)

            return types.uint32(lo, hi), codegen
        return _pack

    _pack_f16, _pack_bf16 = pack_overload("f16x2"), pack_overload("bf16x2")

    @overload(tc.pack_f16x2, target="cuda")
    def _pack_f16_impl(lo, hi):
        return lambda lo, hi: _pack_f16(lo, hi)

    @overload(tc.pack_bf16x2, target="cuda")
    def _pack_bf16_impl(lo, hi):
        return lambda lo, hi: _pack_bf16(lo, hi)

    def unpack_overload(kind: str):
        @intrinsic
        def _unpack(typingctx, word):
            if not isinstance(word, types.Integer):
                raise TypingError(f"pnex.tc.unpack_{kind}x2: the word must be an integer (a packed pair), got {word}")

            def codegen(context, builder, signature, args):
                bits = context.cast(builder, args[0], signature.args[0], types.uint32)
                if kind == "f16":  # cvt.f32.f16 each half
                    f16 = ir.HalfType()
                    halves = [builder.trunc(bits, ir.IntType(16)),
                              builder.trunc(builder.lshr(bits, ir.Constant(i32, 16)), ir.IntType(16))]
                    lo, hi = [builder.fpext(builder.bitcast(h, f16), f32) for h in halves]
                else:  # a bfloat16 is the upper half of a float32
                    lo = builder.bitcast(builder.shl(bits, ir.Constant(i32, 16)), f32)
                    hi = builder.bitcast(builder.and_(bits, ir.Constant(i32, 0xFFFF0000)), f32)
                return context.make_tuple(builder, signature.return_type, [lo, hi])

            return types.UniTuple(types.float32, 2)(word), codegen
        return _unpack

    _unpack_f16, _unpack_bf16 = unpack_overload("f16"), unpack_overload("bf16")

    @overload(tc.unpack_f16x2, target="cuda")
    def _unpack_f16_impl(word):
        return lambda word: _unpack_f16(word)

    @overload(tc.unpack_bf16x2, target="cuda")
    def _unpack_bf16_impl(word):
        return lambda word: _unpack_bf16(word)

    @intrinsic
    def _store_pair(typingctx, array, index, lo, hi):
        if not is_index(index) or not isinstance(array, types.Array):
            return None
        kinds = {"float16": "f16x2", "bfloat16": "bf16x2", "__nv_bfloat16": "bf16x2"}
        if str(array.dtype) not in kinds:
            raise TypingError(f"pnex.tc.store_pair: the array must hold float16 or bfloat16, got {array.dtype}")
        if not array.mutable:
            raise TypingError("pnex.tc.store_pair: the array is read-only")
        problem = subscripts_error("store_pair", array, index, "array")
        if problem:
            raise TypingError(problem)
        conversion = kinds[str(array.dtype)]

        def codegen(context, builder, signature, args):
            array_ty, index_ty, lo_ty, hi_ty = signature.args
            where = element_pointer(context, builder, array_ty, args[0], index_values(context, builder, index_ty, args[1]))
            lo_v = context.cast(builder, args[2], lo_ty, types.float32)
            hi_v = context.cast(builder, args[3], hi_ty, types.float32)
            word = builder.asm(ir.FunctionType(i32, [f32, f32]), f"cvt.rn.{conversion}.f32 $0, $1, $2;", "=r,f,f",
                               [hi_v, lo_v], False)
            builder.store(word, builder.bitcast(where, i32.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.none(array, index, lo, hi), codegen

    @intrinsic
    def _store_words(typingctx, array, index, words):
        if not is_index(index) or not isinstance(array, types.Array) or not isinstance(words, types.BaseTuple):
            return None
        count = len(words)
        if count not in (1, 2, 4) or not all(isinstance(w, types.Integer) for w in words):
            raise TypingError(f"pnex.tc.store_words: the words must be a tuple of 1, 2 or 4 integers, got {words}")
        if not array.mutable:
            raise TypingError("pnex.tc.store_words: the array is read-only")

        def codegen(context, builder, signature, args):
            array_ty, index_ty, words_ty = signature.args
            where = element_pointer(context, builder, array_ty, args[0], index_values(context, builder, index_ty, args[1]))
            items = [as_i32(builder, context.cast(builder, v, t, types.uint32))
                     for v, t in zip(cgutils.unpack_tuple(builder, args[2], count), words_ty)]
            if count == 1:
                builder.store(items[0], builder.bitcast(where, i32.as_pointer()), align=4)
            else:
                vector_ty = ir.VectorType(i32, count)
                packed = ir.Constant(vector_ty, ir.Undefined)
                for k, v in enumerate(items):
                    packed = builder.insert_element(packed, v, ir.Constant(i32, k))
                builder.store(packed, builder.bitcast(where, vector_ty.as_pointer()), align=4 * count)
            return context.get_dummy_value()

        return types.none(array, index, words), codegen

    @overload(tc.store_words, target="cuda")
    def _store_words_impl(array, index, words):
        return lambda array, index, words: _store_words(array, index, words)

    @overload(tc.store_pair, target="cuda")
    def _store_pair_impl(array, index, lo, hi):
        return lambda array, index, lo, hi: _store_pair(array, index, lo, hi)

    def _float_instruction(text, constraints, result, ir_result):
        """An intrinsic of one float32 operand (any number, converted) and one result: the
        PTX ``text`` with ``constraints``."""

        @intrinsic
        def _instruction(typingctx, x):
            if not isinstance(x, (types.Float, types.Integer)):
                return None

            def codegen(context, builder, signature, args):
                v = context.cast(builder, args[0], signature.args[0], types.float32)
                return builder.asm(ir.FunctionType(ir_result, [f32]), text, constraints, [v], False)

            return result(x), codegen

        return _instruction

    _to_tf32 = _float_instruction("cvt.rna.tf32.f32 $0, $1;", "=r,f", types.uint32, i32)
    _exp2_approx = _float_instruction("ex2.approx.ftz.f32 $0, $1;", "=f,f", types.float32, f32)

    @overload(tc.to_tf32, target="cuda")
    def _to_tf32_impl(x):
        return lambda x: _to_tf32(x)

    @overload(tc.exp2_approx, target="cuda")
    def _exp2_approx_impl(x):
        return lambda x: _exp2_approx(x)

    # ---- tiles of a 1-D array (dynamic shared memory) ---------------------------------------------

    @intrinsic
    def _tile(typingctx, raw, offset, shape):
        if not isinstance(raw, types.Array) or raw.ndim != 1 or not isinstance(offset, types.Integer):
            return None
        if not isinstance(shape, types.BaseTuple) or not all(isinstance(t, types.Integer) for t in shape):
            return None
        ndim = len(shape)
        result = types.Array(raw.dtype, ndim, "C", readonly=not raw.mutable)

        def codegen(context, builder, signature, args):
            from numba.cuda.np.arrayobj import populate_array

            raw_ty, offset_ty, shape_ty = signature.args
            source = context.make_array(raw_ty)(context, builder, args[0])
            start = context.cast(builder, args[1], offset_ty, types.intp)
            dims = [context.cast(builder, v, t, types.intp)
                    for v, t in zip(cgutils.unpack_tuple(builder, args[2], ndim), shape_ty)]
            itemsize = context.get_abi_sizeof(context.get_data_type(raw_ty.dtype))
            strides = []
            step = ir.Constant(i64, itemsize)
            for d in reversed(dims):
                strides.insert(0, step)
                step = builder.mul(step, d)
            out = context.make_array(signature.return_type)(context, builder)
            populate_array(out, data=builder.gep(source.data, [start]), shape=dims, strides=strides,
                           itemsize=source.itemsize, meminfo=None)
            return out._getvalue()

        return result(raw, offset, shape), codegen

    @overload(tc.tile, target="cuda", inline="always")
    def _tile_impl(raw, offset, shape):
        if not isinstance(raw, types.Array) or raw.ndim != 1:
            raise TypingError(f"pnex.tc.tile: the array must be 1-D (dynamic shared memory), got {raw}")
        if not isinstance(shape, types.BaseTuple) or not all(isinstance(t, types.Integer) for t in shape):
            raise TypingError(f"pnex.tc.tile: the shape must be a tuple of integers, got {shape}")
        return lambda raw, offset, shape: _tile(raw, offset, shape)

    # ---- wgmma (Hopper) -----------------------------------------------------------------------------

    def descriptor(builder: Any, address: Any) -> Any:
        """The shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle
        starting at ``address`` (32-bit shared): start >> 4, leading byte offset 16 (unused
        when swizzled), stride byte offset 1024 (8 rows of 128 bytes), swizzle mode 1."""
        start = builder.lshr(builder.and_(builder.zext(address, i64), ir.Constant(i64, 0x3FFFF)), ir.Constant(i64, 4))
        fixed = (1 << 16) | ((1024 >> 4) << 32) | (1 << 62)
        return builder.or_(start, ir.Constant(i64, fixed))

    @intrinsic
    def _wgmma(typingctx, acc, a, a_index, b, b_index, n, accumulate, kind):
        width, k = _literal(n), _literal(kind)
        if not isinstance(width, int) or k not in ("f16", "bf16") or not (is_index(a_index) and is_index(b_index)):
            return None
        if not isinstance(accumulate, (types.Boolean, types.Integer)):
            return None
        name = "wgmma" if k == "f16" else "wgmma_bf16"
        if width % 8 or not 8 <= width <= 256:
            raise TypingError(f"pnex.tc.{name}: n must be a multiple of 8 from 8 to 256, got {width}")
        problem = fragment_error(name, acc, (types.float32,), "the accumulator")
        if problem:
            raise TypingError(problem)
        for tile, what in ((a, "A"), (b, "B")):
            if not isinstance(tile, types.Array) or tile.dtype.bitwidth != 16:
                raise TypingError(f"pnex.tc.{name}: the {what} tile must be a shared array of 16-bit elements, got {tile}")
        for tile, index, what in ((a, a_index, "A tile"), (b, b_index, "B tile")):
            problem = subscripts_error(name, tile, index, what)
            if problem:
                raise TypingError(problem)
        regs = width // 2

        def codegen(context, builder, signature, args):
            acc_ty, a_ty, a_index_ty, b_ty, b_index_ty, _, accumulate_ty, _ = signature.args
            acc_p = fragment_pointers(context, builder, acc_ty, args[0], regs)
            c_vals = [builder.load(p) for p in acc_p]
            a_at = element_pointer(context, builder, a_ty, args[1], index_values(context, builder, a_index_ty, args[2]))
            b_at = element_pointer(context, builder, b_ty, args[3], index_values(context, builder, b_index_ty, args[4]))
            desc_a = descriptor(builder, shared_address(builder, a_at))
            desc_b = descriptor(builder, shared_address(builder, b_at))
            outs = ",".join(f"${i}" for i in range(regs))
            asm = (
                "{\n.reg .pred p;\n"
                f"setp.ne.b32 p, ${regs + 2}, 0;\n"
                f"wgmma.mma_async.sync.aligned.m64n{width}k16.f32.{k}.{k} {{{outs}}}, ${regs}, ${regs + 1}, p, 1, 1, 0, 0;\n"
                "}"
            )
            constraints = ",".join(["=f"] * regs + ["l", "l", "r"] + [str(i) for i in range(regs)] + ["~{memory}"])
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * regs), [i64, i64, i32] + [f32] * regs)
            scale_d = builder.zext(context.cast(builder, args[6], accumulate_ty, types.boolean), i32)
            out = builder.asm(fnty, asm, constraints, [desc_a, desc_b, scale_d] + c_vals, True)
            for i, p in enumerate(acc_p):
                builder.store(builder.extract_value(out, i), p)
            return context.get_dummy_value()

        return types.none(acc, a, a_index, b, b_index, n, accumulate, kind), codegen

    def wgmma_overload(name: str, kind: str):
        def impl(acc, a, a_index, b, b_index, n, accumulate=True):
            if not isinstance(_literal(n), int):
                raise TypingError(f"pnex.tc.{name}: n (the tile's columns) must be a constant or a Tune parameter")
            return lambda acc, a, a_index, b, b_index, n, accumulate=True: _wgmma(
                acc, a, a_index, b, b_index, n, accumulate, kind)
        return impl

    overload(tc.wgmma, target="cuda", prefer_literal=True)(wgmma_overload("wgmma", "f16"))
    overload(tc.wgmma_bf16, target="cuda", prefer_literal=True)(wgmma_overload("wgmma_bf16", "bf16"))

    def statement(text: str):
        @intrinsic
        def _statement(typingctx):
            def codegen(context, builder, signature, args):
                builder.asm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", [], True)
                return context.get_dummy_value()
            return types.none(), codegen
        return _statement

    _wg_fence = statement("wgmma.fence.sync.aligned;")
    _wg_commit = statement("wgmma.commit_group.sync.aligned;")
    _proxy_fence = statement("fence.proxy.async.shared::cta;")

    @overload(tc.wgmma_fence, target="cuda")
    def _wg_fence_impl():
        return lambda: _wg_fence()

    @overload(tc.wgmma_commit, target="cuda")
    def _wg_commit_impl():
        return lambda: _wg_commit()

    @overload(tc.fence_async_shared, target="cuda")
    def _proxy_fence_impl():
        return lambda: _proxy_fence()

    _wg_wait = wait_intrinsic("wgmma.wait_group.sync.aligned")

    @overload(tc.wgmma_wait, target="cuda", prefer_literal=True)
    def _wg_wait_impl(pending):
        if not isinstance(_literal(pending), int) and not isinstance(pending, types.Integer):
            raise TypingError(f"pnex.tc.wgmma_wait: the number of pending groups must be an integer, got {pending}")
        return lambda pending: _wg_wait(pending)

    register_bulk(literal=_literal, is_index=is_index, index_values=index_values, element_pointer=element_pointer,
                  shared_address=shared_address, subscripts_error=subscripts_error)  # TMA, mbarrier, setmaxnreg
    register_collectives()  # swizzle, warp and block reductions and scans: pure Python, compiled
