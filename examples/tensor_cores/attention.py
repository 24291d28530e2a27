"""Attention forward, FlashAttention-2 style, as a pnex kernel: one pass over K and V
with an online softmax (a running maximum and sum per query row), every product on the
tensor cores (``mma.sync`` m16n8k16), K and V tiles double-buffered by ``cp.async``.

q, k, v: (batch, heads, seq, head_dim) float16 or bfloat16, contiguous; o likewise.
Each block takes BM = 16 x warps query rows of one (batch, head); each warp 16 rows,
whose S = Q K^T tile (16 x BN) and output accumulators (16 x head_dim) stay in
registers: S becomes P, the A operand of P @ V, without leaving them (the
accumulator layout of one m16n8k16 is the A layout of the next, two by two).
seq must be a multiple of BM and BN (the op refuses other shapes before it launches,
:mod:`tiles`); head_dim 64 or 128.
"""

import math

from numba import cuda, float32, uint32
from numba.cuda.types import float16

import pnex_magic as pnex
from pnex_magic import tc
from tiles import tile_rule

LOG2E = 1.4426950408889634


def shared_bytes(head_dim, warps=4, bn=64):
    return (16 * warps + 4 * bn) * head_dim * 2


def make_attention(dtype="f16", head_dim=128, causal=False, warps=4, bn=64):
    """The pnex op ``o = attention(q, k, v, scale)``."""
    mma = tc.mma if dtype == "f16" else tc.mma_bf16
    pack = tc.pack_f16x2 if dtype == "f16" else tc.pack_bf16x2
    D = head_dim
    BM = 16 * warps
    threads = 32 * warps
    KD = D // 16  # k16 steps over head_dim (S = Q K^T)
    ND = D // 8  # n8 tiles over head_dim (O)
    NB = bn // 8  # n8 tiles over a key block (S)
    KB = bn // 16  # k16 steps over a key block (P V)
    NB2, ND2 = NB // 2, ND // 2  # x4 loads of K (two n8 tiles each) and of V
    q_in_registers = D <= 64  # head_dim 128: Q's fragments are read from shared memory at each use
    QF = KD if q_in_registers else 1
    q_chunks = BM * D // 8 // threads
    kv_chunks = bn * D // 8 // threads
    q_elems = BM * D
    kv_elems = bn * D
    smem = shared_bytes(D, warps, bn)
    NEG = -math.inf
    L2E = LOG2E

    @pnex.jit(
        n_threads=(f"q.size(2) // {BM} * {threads}", "q.size(0) * q.size(1)"),
        threads_per_block=(threads, 1),
        shared_bytes=smem,
        requires={**tile_rule("q.size(2)", BM, "the query length", "the query block BM = 16 x warps"),
                  **tile_rule("k.size(2)", bn, "the key length", "the key block BN")},
    )
    def attention(
        q: pnex.In(dtype, (None, None, None, D)),
        k: pnex.In(dtype, ("q.size(0)", "q.size(1)", None, D)),
        v: pnex.In(dtype, ("q.size(0)", "q.size(1)", "k.size(2)", D)),
        scale: float,
        o: pnex.Out(dtype, "q"),
    ):
        raw = cuda.shared.array(0, float16, alignment=1024)
        sq = tc.tile(raw, 0, (BM, D))
        sk = tc.tile(raw, q_elems, (2, bn, D))
        sv = tc.tile(raw, q_elems + 2 * kv_elems, (2, bn, D))
        bh = cuda.blockIdx.y
        b = bh // q.shape[1]
        h = bh % q.shape[1]
        q0 = cuda.blockIdx.x * BM
        seq_k = k.shape[2]
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4
        neg = float32(NEG)  # float32 throughout: a Python float literal is a float64 in Numba
        zero = float32(0.0)
        scale2 = scale * float32(L2E)  # softmax in base 2: exp(x) = exp2(x log2 e)

        n_blocks = seq_k // bn
        if causal:
            n_blocks = min(n_blocks, (q0 + BM + bn - 1) // bn)

        for c in range(q_chunks):  # Q, and the first K/V block
            ch = tid + threads * c
            row = ch // (D // 8)
            col = (ch % (D // 8)) * 8
            tc.cp_async(sq, (row, tc.swizzle(row, col, D)), q, (b, h, q0 + row, col))
        for c in range(kv_chunks):
            ch = tid + threads * c
            row = ch // (D // 8)
            col = (ch % (D // 8)) * 8
            tc.cp_async(sk, (0, row, tc.swizzle(row, col, D)), k, (b, h, row, col))
            tc.cp_async(sv, (0, row, tc.swizzle(row, col, D)), v, (b, h, row, col))
        tc.cp_async_commit()

        qf = cuda.local.array((QF, 4), uint32)  # Q's A fragments: all of them, or one at a time (head_dim 128)
        kf = cuda.local.array(4, uint32)
        vf = cuda.local.array(4, uint32)
        pf = cuda.local.array(4, uint32)
        s_acc = cuda.local.array((NB, 4), float32)
        o_acc = cuda.local.array((ND, 4), float32)
        for j in range(ND):
            for r in range(4):
                o_acc[j, r] = 0.0
        m_lo = neg  # running maximum of rows g and g + 8 (scaled, base 2)
        m_hi = neg
        l_lo = zero
        l_hi = zero

        for kb in range(n_blocks):
            tc.cp_async_wait(0)
            cuda.syncthreads()  # block kb is in stage kb % 2; everyone is done with stage (kb + 1) % 2
            if q_in_registers and kb == 0:
                for kk in range(KD):
                    r = warp * 16 + lane % 16
                    col = kk * 16 + (lane // 16) * 8
                    tc.ldmatrix(qf[kk], sq, (r, tc.swizzle(r, col, D)))
            if kb + 1 < n_blocks:
                nxt = (kb + 1) % 2
                for c in range(kv_chunks):
                    ch = tid + threads * c
                    row = ch // (D // 8)
                    col = (ch % (D // 8)) * 8
                    key = (kb + 1) * bn + row
                    tc.cp_async(sk, (nxt, row, tc.swizzle(row, col, D)), k, (b, h, key, col))
                    tc.cp_async(sv, (nxt, row, tc.swizzle(row, col, D)), v, (b, h, key, col))
            tc.cp_async_commit()
            st = kb % 2

            # S = Q K^T (16 x bn per warp)
            for j in range(NB):
                for r in range(4):
                    s_acc[j, r] = zero
            for kk in range(KD):
                qk = kk if q_in_registers else 0
                if not q_in_registers:
                    r = warp * 16 + lane % 16
                    col = kk * 16 + (lane // 16) * 8
                    tc.ldmatrix(qf[0], sq, (r, tc.swizzle(r, col, D)))
                for j in range(NB2):
                    key = j * 16 + (lane // 16) * 8 + lane % 8
                    col = kk * 16 + ((lane // 8) % 2) * 8
                    tc.ldmatrix(kf, sk, (st, key, tc.swizzle(key, col, D)))
                    mma(s_acc[2 * j], qf[qk], kf[0:2])
                    mma(s_acc[2 * j + 1], qf[qk], kf[2:4])

            # online softmax, rows g (elements 0, 1) and g + 8 (elements 2, 3)
            row_lo = q0 + warp * 16 + g
            row_hi = row_lo + 8
            mx_lo = neg
            mx_hi = neg
            for j in range(NB):
                for r in range(4):
                    x = s_acc[j, r] * scale2
                    if causal:
                        key = kb * bn + j * 8 + 2 * t + r % 2
                        if key > (row_lo if r < 2 else row_hi):
                            x = neg
                    s_acc[j, r] = x
                mx_lo = max(mx_lo, max(s_acc[j, 0], s_acc[j, 1]))
                mx_hi = max(mx_hi, max(s_acc[j, 2], s_acc[j, 3]))
            mx_lo = max(mx_lo, cuda.shfl_xor_sync(0xFFFFFFFF, mx_lo, 1))
            mx_lo = max(mx_lo, cuda.shfl_xor_sync(0xFFFFFFFF, mx_lo, 2))
            mx_hi = max(mx_hi, cuda.shfl_xor_sync(0xFFFFFFFF, mx_hi, 1))
            mx_hi = max(mx_hi, cuda.shfl_xor_sync(0xFFFFFFFF, mx_hi, 2))
            new_lo = max(m_lo, mx_lo)
            new_hi = max(m_hi, mx_hi)
            # a row that has seen only masked keys keeps -inf: scale by 1, add nothing
            base_lo = new_lo if new_lo != neg else zero
            base_hi = new_hi if new_hi != neg else zero
            alpha_lo = math.exp2(m_lo - base_lo)
            alpha_hi = math.exp2(m_hi - base_hi)
            m_lo = new_lo
            m_hi = new_hi
            sum_lo = zero
            sum_hi = zero
            for j in range(NB):
                s_acc[j, 0] = math.exp2(s_acc[j, 0] - base_lo)
                s_acc[j, 1] = math.exp2(s_acc[j, 1] - base_lo)
                s_acc[j, 2] = math.exp2(s_acc[j, 2] - base_hi)
                s_acc[j, 3] = math.exp2(s_acc[j, 3] - base_hi)
                sum_lo += s_acc[j, 0] + s_acc[j, 1]
                sum_hi += s_acc[j, 2] + s_acc[j, 3]
            l_lo = l_lo * alpha_lo + sum_lo  # per-lane partial sums: the quad is summed at the end
            l_hi = l_hi * alpha_hi + sum_hi
            for j in range(ND):
                o_acc[j, 0] *= alpha_lo
                o_acc[j, 1] *= alpha_lo
                o_acc[j, 2] *= alpha_hi
                o_acc[j, 3] *= alpha_hi

            # O += P V: P's 16 x 16 slices are A fragments made of two S tiles each
            for kk in range(KB):
                pf[0] = pack(s_acc[2 * kk, 0], s_acc[2 * kk, 1])
                pf[1] = pack(s_acc[2 * kk, 2], s_acc[2 * kk, 3])
                pf[2] = pack(s_acc[2 * kk + 1, 0], s_acc[2 * kk + 1, 1])
                pf[3] = pack(s_acc[2 * kk + 1, 2], s_acc[2 * kk + 1, 3])
                for j in range(ND2):
                    key = kk * 16 + lane % 16
                    col = j * 16 + (lane // 16) * 8
                    tc.ldmatrix(vf, sv, (st, key, tc.swizzle(key, col, D)), 4, True)
                    mma(o_acc[2 * j], pf, vf[0:2])
                    mma(o_acc[2 * j + 1], pf, vf[2:4])

        l_lo += cuda.shfl_xor_sync(0xFFFFFFFF, l_lo, 1)
        l_lo += cuda.shfl_xor_sync(0xFFFFFFFF, l_lo, 2)
        l_hi += cuda.shfl_xor_sync(0xFFFFFFFF, l_hi, 1)
        l_hi += cuda.shfl_xor_sync(0xFFFFFFFF, l_hi, 2)
        inv_lo = float32(1.0) / l_lo if l_lo > zero else zero
        inv_hi = float32(1.0) / l_hi if l_hi > zero else zero
        row = q0 + warp * 16 + g
        for j in range(ND):
            col = j * 8 + 2 * t
            tc.store_pair(o, (b, h, row, col), o_acc[j, 0] * inv_lo, o_acc[j, 1] * inv_lo)
            tc.store_pair(o, (b, h, row + 8, col), o_acc[j, 2] * inv_hi, o_acc[j, 3] * inv_hi)

    return attention
