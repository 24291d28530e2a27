"""pnex.tc, the tensor-core primitives, on CPU: the simulator's NumPy references
against references written independently from the PTX ISA's formulas; typing errors;
the SASS of a compiled tile (one HMMA per mma, fragments in registers).  The same
kernels run on a GPU in tests/test_tc_gpu.py."""

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pnex_magic as pnex
from pnex_magic import tc
from pnex_magic.errors import KernelDefinitionError, KernelTypingError
from pnex_magic.launch import autotune
from pnex_magic.tc import layouts

sys.path.insert(0, str(Path(__file__).parent))
import tc_kernels as K  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _words(t16: torch.Tensor) -> torch.Tensor:
    """A (r, 2c) 16-bit tensor as (r, c) int32 words, low half first."""
    return t16.contiguous().view(torch.int32)


def _round_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 -> tf32 bits kept in a float32 (the top 19 bits)."""
    bits = x.contiguous().view(torch.int32)
    return (bits & -8192).view(torch.float32)


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
def test_mma_fragment_layout_is_the_isa_formula(kind):
    """The layout tables against the PTX ISA's formulas, written out again here."""
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a = layouts.mma_a_layout(kind)[lane]
        b = layouts.mma_b_layout(kind)[lane]
        c = layouts.mma_c_layout()[lane]
        if kind == "tf32":
            assert [tuple(x) for x in a] == [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)]
            assert [tuple(x) for x in b] == [(t, g), (t + 4, g)]
        else:
            want = []
            for i in range(8):  # a_i: row g for a0,a1,a4,a5; g+8 for a2,a3,a6,a7
                row = g if i in (0, 1, 4, 5) else g + 8
                col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
                want.append((row, col))
            assert [tuple(x) for x in a] == want
            assert [tuple(x) for x in b] == [(2 * t + (i & 1) + (8 if i >= 2 else 0), g) for i in range(4)]
        assert [tuple(x) for x in c] == [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]


def _mma_inputs(kind, gen):
    m, n, k = (16, 8, 8) if kind == "tf32" else (16, 8, 16)
    A = torch.randn(m, k, generator=gen)
    B = torch.randn(k, n, generator=gen)
    C = torch.randn(m, n, generator=gen)
    if kind == "f16":
        A16, B16 = A.half(), B.half()
        args = (_words(A16), _words(B16.t().contiguous()), C)
        ref = A16.double() @ B16.double() + C.double()
    elif kind == "bf16":
        A16, B16 = A.bfloat16(), B.bfloat16()
        args = (_words(A16), _words(B16.t().contiguous()), C)
        ref = A16.double() @ B16.double() + C.double()
    else:
        args = (A.view(torch.int32), B.t().contiguous().view(torch.int32), C)
        ref = _round_tf32(A).double() @ _round_tf32(B).double() + C.double()
    return args, ref


def mma_op(kind):
    return {"f16": K.mma_f16, "bf16": K.mma_bf16, "tf32": K.mma_tf32}[kind]


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
def test_mma_on_cpu_is_a_matrix_product(kind):
    gen = torch.Generator().manual_seed(11)
    args, ref = _mma_inputs(kind, gen)
    d = mma_op(kind)(*args)
    # float32 accumulation of exact products: within a few float32 ulps of the float64 sum
    torch.testing.assert_close(d.double(), ref, rtol=2e-6, atol=2e-6)


def _ldmatrix_reference(tile: np.ndarray, count: int, trans: bool) -> np.ndarray:
    """(32, 4) int32 words: lane 8 j + r points at row (j % 4) * 8 + r, column 8 (lane % 2)."""
    bits = tile.view(np.uint16)
    out = np.zeros((32, 4), dtype=np.uint32)
    for j in range(count):
        rows = []
        for r in range(8):
            lane = 8 * j + r
            row, col = (j % 4) * 8 + r, 8 * (lane % 2)
            rows.append(bits[row, col:col + 8])
        mat = np.stack(rows)  # 8 x 8 of matrix j
        for lane in range(32):
            g, t = lane // 4, lane % 4
            if trans:
                lo, hi = mat[2 * t, g], mat[2 * t + 1, g]
            else:
                lo, hi = mat[g, 2 * t], mat[g, 2 * t + 1]
            out[lane, j] = int(lo) | (int(hi) << 16)
    return out.view(np.int32)


@pytest.mark.parametrize("count,trans", [(1, False), (2, False), (4, False), (2, True), (4, True)])
def test_ldmatrix_on_cpu_matches_the_isa(count, trans):
    tile = torch.randn(32, 16, generator=torch.Generator().manual_seed(count + 10 * trans)).half()
    op = K._ldmatrix_kernel(count, trans)
    words = op(tile).view(torch.int32)
    want = _ldmatrix_reference(tile.numpy(), count, trans)
    assert np.array_equal(words.numpy(), want)


def test_cp_async_with_swizzle_and_zero_fill_on_cpu():
    src = torch.randn(16, 64, generator=torch.Generator().manual_seed(3)).half()
    dst = K.cp_async_copy(src, 11)
    want = src.clone()
    want[11:] = 0
    assert torch.equal(dst, want)


def test_swizzle_is_a_permutation_within_each_128_byte_line_and_conflict_free():
    for row_elems in (16, 32, 64, 128, 256):
        for row in range(16):
            cols = [tc.swizzle(row, c, row_elems) for c in range(row_elems)]
            assert sorted(cols) == list(range(row_elems))
            for c in range(row_elems):  # an 8-element chunk stays whole and inside its 128-byte line
                assert cols[c] % 8 == c % 8 and cols[c] // 64 == c // 64
        # ldmatrix: 8 consecutive rows at one 16-byte column chunk touch 8 different bank groups
        for chunk in range(row_elems // 8):
            for first in range(0, 16, 8):
                banks = {((r * row_elems + tc.swizzle(r, 8 * chunk, row_elems)) * 2 // 16) % 8 for r in range(first, first + 8)}
                assert len(banks) == 8, (row_elems, chunk)


def test_reductions_and_shuffles_on_cpu():
    x = torch.randn(128, generator=torch.Generator().manual_seed(5))
    sums = reductions_ref = K.reductions(x)
    xw = x.view(4, 32).double()
    torch.testing.assert_close(sums[:, 0].double(), xw.sum(1).repeat_interleave(32), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sums[:, 1].double(), xw.max(1).values.repeat_interleave(32))
    torch.testing.assert_close(sums[:, 2].double(), x.double().sum().expand(128), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(sums[:, 3].double(), x.double().cumsum(0), rtol=1e-5, atol=1e-5)
    assert torch.equal(sums[:, 4], x.max().expand(128))
    del reductions_ref
    v = torch.randint(-1000, 1000, (32,), generator=torch.Generator().manual_seed(6), dtype=torch.int32)
    out = K.shuffles(v)
    lanes = torch.arange(32)
    assert torch.equal(out[:, 0], v[(lanes * 7) % 32])
    assert torch.equal(out[:, 1], torch.where(lanes >= 3, v[(lanes - 3).clamp(min=0)], v))
    assert torch.equal(out[:, 2], torch.where(lanes + 5 < 32, v[(lanes + 5).clamp(max=31)], v))
    assert torch.equal(out[:, 3], v[lanes ^ 9])


def _exp2_inputs():
    """Fresh arguments of ``2 ** x`` from -150 to 130: ordinary ones, results that are
    subnormal (flushed), past float32's range (inf), and subnormal arguments."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    x = torch.rand(256, generator=gen) * 280 - 150
    x[:4] = torch.tensor([0.0, 1e-40, -1e-40, 127.5])
    return x


def test_exp2_approx_on_cpu_is_exp2_flushed():
    """``tc.exp2_approx``: 2 ** x correctly rounded where the result is a normal float32,
    zero where it would be subnormal, inf past the range; a subnormal argument is zero."""
    x = _exp2_inputs()
    y = K.exp2s(x).double()
    want = torch.exp2(x.double())
    normal = (want >= 2.0**-126) & (want < 2.0**128)
    assert torch.equal(y[normal], want[normal].float().double())
    assert (y[want < 2.0**-126] == 0).all() and torch.isinf(y[want >= 2.0**128]).all()
    assert y[1] == 1.0 and y[2] == 1.0


def test_packing_on_cpu_rounds_to_nearest():
    x = torch.randn(32, 2, generator=torch.Generator().manual_seed(8)) * 100
    w = K.packing(x).view(torch.int32)
    assert torch.equal(w[:, 0], _words(x.half()).view(32))
    assert torch.equal(w[:, 1], _words(x.bfloat16()).view(32))
    # cvt.rna.tf32.f32: to nearest, ties away from zero, on the 13 dropped bits
    bits = x[:, 0].contiguous().view(torch.int32).long() & 0xFFFFFFFF
    want = ((bits + 0x1000) & 0xFFFFE000)
    assert torch.equal(w[:, 2].long() & 0xFFFFFFFF, want)


def _unpack_words():
    """Words whose halves are random float16/bfloat16 bits, with zeros, infinities, NaN and
    subnormals among them."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()))
    halves = torch.randint(0, 2**16, (64, 2), generator=gen, dtype=torch.int32)
    halves[:6, 0] = torch.tensor([0x0000, 0x8000, 0x7C00, 0x7F80, 0x0001, 0x7E00])  # f16/bf16 specials
    return (halves[:, 0] | (halves[:, 1] << 16)), halves


def test_unpacking_on_cpu_is_exact():
    """``unpack_f16x2``/``unpack_bf16x2``: each half's float16 (bfloat16) value, exactly, as
    torch reads the same bits; packing the unpacked pair gives the word back (NaN aside)."""
    words, halves = _unpack_words()
    x = K.unpacking(words.view(torch.uint32))
    as_f16 = halves.to(torch.int16).view(torch.float16).float()
    as_bf16 = halves.to(torch.int16).view(torch.bfloat16).float()
    torch.testing.assert_close(x[:, :2], as_f16, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(x[:, 2:], as_bf16, rtol=0, atol=0, equal_nan=True)
    back = K.packing(x[:32, :2].contiguous()).view(torch.int32)[:, 0]
    keep = ~torch.isnan(x[:32, :2]).any(1)
    assert torch.equal(back[keep], words[:32][keep])


def test_gemm_example_on_cpu():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_mma import make_gemm

    gen = torch.Generator().manual_seed(21)
    a = torch.randn(128, 64, generator=gen).half()
    b = torch.randn(64, 128, generator=gen).half()
    c = make_gemm("f16")(a, b)
    ref = a.double() @ b.double()
    # the output is float16: within half an ulp of float16 (plus float32 accumulation)
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 1e-3).all()


def test_typing_errors_name_the_primitive():
    from numba import cuda, float64, uint32

    with pytest.raises(KernelTypingError, match=r"pnex\.tc\.mma: the accumulator must hold float32"):
        @pnex.jit(n_threads=32)
        def bad_acc(out: pnex.Out("f32", (4,))):
            acc = cuda.local.array(4, float64)
            af = cuda.local.array(4, uint32)
            bf = cuda.local.array(2, uint32)
            tc.mma(acc, af, bf)
            out[0] = acc[0]

    with pytest.raises(KernelTypingError, match=r"cp_async_wait: the number of pending groups must be an integer"):
        @pnex.jit(n_threads=32)
        def bad_wait(n: float, out: pnex.Out("f32", (4,))):
            tc.cp_async_wait(n)


def test_a_tensor_core_kernel_is_compiled_for_sm80_without_a_gpu_and_refused_for_sm75():
    op = K.mma_f16
    from pnex_magic.report import _definition_of

    definition = _definition_of(op, "test")
    assert definition.required_cc == ((8, 0), "cp_async") or definition.required_cc[0] == (8, 0)
    if not torch.cuda.is_available():
        assert definition.target_arch() == "sm_80"
    with pytest.raises(KernelDefinitionError, match=r"calls pnex\.tc\.mma, which needs sm_80 or newer"):
        definition.target_arch("sm_75")


def test_sass_has_one_hmma_per_mma_and_no_local_memory():
    from pnex_magic import sass
    from pnex_magic.report import _definition_of

    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump/nvdisasm (the sass extra)")
    compiled = _definition_of(K.mma_f16, "test").compiled("sm_90")
    if compiled.cubin is None:
        pytest.skip("no nvJitLink")
    assert compiled.resources.local_bytes == 0 and not compiled.resources.spills
    text = sass.disassemble(compiled.cubin, entry=compiled.entry).text
    assert text.count("HMMA.16816.F32") == 1
    assert "CALL" not in text


def test_bf16_gemm_example_on_cpu():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_mma import make_gemm

    gen = torch.Generator().manual_seed(22)
    a = torch.randn(128, 32, generator=gen).bfloat16()
    b = torch.randn(32, 64, generator=gen).bfloat16()
    c = make_gemm("bf16", 128, 64, 4)(a, b)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-8 + 1e-3).all()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_wgmma_linear_example_on_cpu(dtype):
    """Hopper's wgmma in the simulator: a warpgroup of 128 threads reads both operands
    through the 128-byte swizzle; the fused bias + GELU epilogue too."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    import torch.nn.functional as F
    from gemm_wgmma import make_linear

    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    gen = torch.Generator().manual_seed(23)
    a = torch.randn(64, 128, generator=gen).to(tdt)
    w = torch.randn(128, 128, generator=gen).to(tdt)
    bias = torch.randn(128, generator=gen).to(tdt)
    ulp = 2**-11 if dtype == "f16" else 2**-8
    c = make_linear(dtype, 64, 128, 2, pipelined=False, dynamic=False)(a, w)
    ref = a.double() @ w.double().t()
    assert ((c.double() - ref).abs() <= ref.abs() * ulp + 1e-3).all()
    c = make_linear(dtype, 64, 128, 2, pipelined=False, dynamic=False, gelu=True)(a, w, bias)
    ref = F.gelu(ref + bias.double())
    assert ((c.double() - ref).abs() <= ref.abs() * ulp + 2e-3).all()


def test_wgmma_linear_runs_the_tile_widths_that_divide_n():
    """``BN: Tune(128, 64)`` with ``tune_requires`` naming N: N = 192 runs BN = 64 (128 does
    not divide it), where the op used to refuse every N that the widest choice does not
    divide; an N that no choice divides is refused, naming the rule."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_wgmma import make_linear

    gen = torch.Generator().manual_seed(5)
    a = torch.randn(64, 64, generator=gen).half()
    w = torch.randn(192, 64, generator=gen).half()
    linear = make_linear("f16", 64, (128, 64), 2, pipelined=False, dynamic=False)
    key = autotune.key_values(linear.spec, {"a": a, "w": w})
    assert linear.spec.tune_values(linear.spec.launch_candidates[linear.spec.first_candidate(key)][1])["BN"] == 64
    ref = a.double() @ w.double().t()
    assert ((linear(a, w).double() - ref).abs() <= ref.abs() * 2**-11 + 1e-3).all()
    refused = (r"breaks tune_requires `w.size\(0\) % BN == 0` \(w.size\(0\) = 96\): N must be a multiple of the block "
               r"tile BN; no combination")
    with pytest.raises(pnex.ArgumentValueError, match=refused):
        linear(a, w[:96])


def test_wgmma_kernels_link_from_lto_ir_for_sm90a_without_serialisation():
    """From PTX, nvJitLink's relocatable compile makes ptxas wait for each wgmma
    ("C7509 ... serialized due to the presence of Extern calls"); pnex links wgmma
    kernels from LTO-IR, for sm_90a, and the HGMMAs stay in flight."""
    from pnex_magic import sass
    from pnex_magic.report import _definition_of

    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_wgmma import make_linear

    compiled = _definition_of(make_linear("f16", 64, 128, 2, pipelined=False, dynamic=False), "test").compiled("sm_90")
    if compiled.cubin is None:
        pytest.skip("no nvJitLink")
    assert "C7509" not in compiled.link_log and "sm_90a" in compiled.link_log
    assert compiled.resources.local_bytes == 0
    # the LTO link compiled the function again: Numba's mangled name differs from the PTX's
    from pnex_magic.cubin import cubin_functions

    assert compiled.entry in cubin_functions(compiled.cubin)
    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump/nvdisasm (the sass extra)")
    text = sass.disassemble(compiled.cubin, entry=compiled.entry).text
    assert text.count("HGMMA.64x128x16.F32") == 4
    assert text.count("WARPGROUP.DEPBAR") <= 2  # one wait per k-tile (and the final one), not one per HGMMA


def test_attention_example_on_cpu():
    """FlashAttention-2-style forward in the simulator: two key blocks (the online
    softmax's rescaling), causal masking, dynamic shared memory carved by tc.tile."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    import torch.nn.functional as F
    from attention import make_attention

    gen = torch.Generator().manual_seed(24)
    q, k, v = (torch.randn(1, 1, 128, 64, generator=gen).half() for _ in range(3))
    o = make_attention("f16", 64, True, 4)(q, k, v, 0.125)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, scale=0.125)
    assert (o.double() - ref).abs().max() < 2e-3


def test_tile_views_dynamic_shared_memory_without_a_call():
    """tc.tile is pointer arithmetic: no call to numba's C reshape helper, no stack."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from attention import make_attention
    from pnex_magic.report import _definition_of

    compiled = _definition_of(make_attention("f16", 64, False, 4), "test").compiled("sm_90")
    if compiled.cubin is None:
        pytest.skip("no nvJitLink")
    assert compiled.resources.stack_bytes == 0 and compiled.resources.local_bytes == 0
    assert "numba_attempt_nocopy_reshape" not in compiled.ptx


def test_pnex_tc_reached_through_the_package_in_a_fresh_process(tmp_path, pnex_env):
    """``pnex.tc.warp_sum`` in a kernel of a process that never imported pnex_magic.tc:
    the snapshot froze the package without its lazy submodule (AttributeError at
    compile time); it now loads what the kernel names."""
    import subprocess

    script = tmp_path / "lazy_tc.py"
    script.write_text(
        "import torch\nimport pnex_magic as pnex\nfrom numba import cuda\n"
        "@pnex.jit(n_threads=32, threads_per_block=32)\n"
        "def lazy_tc(x: pnex.In('f32', (32,)), out: pnex.Out('f32', (32,))):\n"
        "    out[cuda.threadIdx.x] = pnex.tc.warp_sum(x[cuda.threadIdx.x])\n"
        "x = torch.randn(32)\nprint('SUM', torch.allclose(lazy_tc(x), x.sum().expand(32), atol=1e-5))\n"
    )
    result = subprocess.run([sys.executable, str(script)], env=pnex_env, capture_output=True, text=True, timeout=300)
    assert "SUM True" in result.stdout, result.stderr[-2000:]


# The reductions as they were written out before the overloads shared one factory per shape
# (pnex_magic/tc/collectives.py): the GPU code must not have changed.
from numba import cuda  # noqa: E402


@cuda.jit(device=True)
def _written_warp_sum(x):
    x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 16)
    x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 8)
    x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 4)
    x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 2)
    x += cuda.shfl_xor_sync(0xFFFFFFFF, x, 1)
    return x


@cuda.jit(device=True)
def _written_warp_max(x):
    x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 16))
    x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 8))
    x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 4))
    x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 2))
    x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 1))
    return x


@cuda.jit(device=True)
def _written_block_sum(x, scratch):
    warp = _written_warp_sum(x)
    lane = cuda.threadIdx.x % 32
    wid = cuda.threadIdx.x // 32
    nwarps = (cuda.blockDim.x + 31) // 32
    if lane == 0:
        scratch[wid] = warp
    cuda.syncthreads()
    total = scratch[0]
    for w in range(1, nwarps):
        total += scratch[w]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _written_block_max(x, scratch):
    warp = _written_warp_max(x)
    lane = cuda.threadIdx.x % 32
    wid = cuda.threadIdx.x // 32
    nwarps = (cuda.blockDim.x + 31) // 32
    if lane == 0:
        scratch[wid] = warp
    cuda.syncthreads()
    total = scratch[0]
    for w in range(1, nwarps):
        total = max(total, scratch[w])
    cuda.syncthreads()
    return total


def _reduce_with_tc(x: pnex.In("f32", (128,)), out: pnex.Out("f32", (128, 4))):
    scratch = cuda.shared.array(4, np.float32)
    tid = cuda.threadIdx.x
    out[tid, 0] = tc.warp_sum(x[tid])
    out[tid, 1] = tc.warp_max(x[tid])
    out[tid, 2] = tc.block_sum(x[tid], scratch)
    out[tid, 3] = tc.block_max(x[tid], scratch)


def _reduce_written_out(x: pnex.In("f32", (128,)), out: pnex.Out("f32", (128, 4))):
    scratch = cuda.shared.array(4, np.float32)
    tid = cuda.threadIdx.x
    out[tid, 0] = _written_warp_sum(x[tid])
    out[tid, 1] = _written_warp_max(x[tid])
    out[tid, 2] = _written_block_sum(x[tid], scratch)
    out[tid, 3] = _written_block_max(x[tid], scratch)


def test_the_reductions_compile_to_the_written_out_shuffles_and_folds():
    """warp_sum/warp_max and block_sum/block_max come from one overload factory each, given
    the combine step (operator.add, max): their PTX is that of the sums and maxima written
    out, instruction for instruction (source lines, Numba's environment symbols and the
    shared array's serial number aside)."""
    from pnex_magic.report import _definition_of

    def body(fn):
        compiled = _definition_of(pnex.jit(n_threads=128, threads_per_block=128)(fn), "test").compiled("sm_90")
        lines = [line for line in compiled.ptx.splitlines()
                 if "NumbaEnv" not in line and not line.strip().startswith((".loc", ".file"))]
        return re.sub(r"_cudapy_smem_\d+", "SMEM", "\n".join(lines).replace(compiled.entry, "ENTRY"))

    ours, written = body(_reduce_with_tc), body(_reduce_written_out)
    assert ours.count("shfl.sync.bfly.b32") == 20 and ours.count("bar.sync") == 4
    assert ours == written
