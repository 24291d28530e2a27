"""Bad inputs to the tensor-core primitives (pnex.tc), without a GPU: each gets one clear
error, never a wrong result.  This file: every kernel compiles checked to a cubin for sm_90 (NVVM
and nvJitLink wheels), the checks inlined; wgmma outside sm_90 and mma below sm_80 are refused;
``backward="auto"`` refuses the primitives by line; the examples refuse shapes their tiles do not
divide.

tests/test_tc_checked_gpu.py runs the same kernels checked on a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import pnex_magic as pnex
from pnex_magic import tc
from pnex_magic.tc import usage
from toolchain import needs_nvvm

sys.path.insert(0, str(Path(__file__).parent))
import tc_bad_kernels as B  # noqa: E402

from tc_checked_helpers import line_of

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- GPU code, checked


@needs_nvvm
@pytest.mark.parametrize("name", ["cp_tile", "ld_tile", "mma_len", "pairs", "wg_tile"])
def test_checked_variants_compile_to_cubins_with_the_checks_inlined(name):
    import re

    definition = getattr(B, name)._pnex
    fast = definition.compiled("sm_90")
    assert "atom.global.cas" not in fast.ptx  # the fast variant has no checks
    compiled = definition.compiled("sm_90", checked=True)
    assert compiled.cubin is not None and compiled.cubin[:4] == b"\x7fELF"
    ptx = compiled.ptx
    assert "atom.global.cas.b64" in ptx  # the record's compare-and-swap
    called = set(re.findall(r"call\.uni[^;]*?\n\s*([\w$]+),", ptx))
    external = set(re.findall(r"\.extern\s+\.func\s*(?:\([^)]*\))?\s*([\w$]+)", ptx))
    assert called <= external, called - external  # every check inlined
    instruction = {"cp_tile": "cp.async.cg.shared.global", "ld_tile": "ldmatrix.sync.aligned.m8n8.x2",
                   "mma_len": "mma.sync.aligned.m16n8k16", "pairs": "cvt.rn.f16x2.f32",
                   "wg_tile": "wgmma.mma_async.sync.aligned.m64n16k16"}[name]
    assert instruction in ptx
    if name in ("ld_tile", "mma_len"):
        assert "vote.sync.all.pred" in ptx  # the warp runs it or skips it together
    if name == "wg_tile":
        assert "bar.red.and.pred" in ptx  # the warpgroup likewise
        assert compiled.arch == "sm_90" and "sm_90a" in compiled.link_log


# ----------------------------------------------------------------------------------------------- architectures


def test_wgmma_exists_on_sm90_only_and_mma_from_sm80():
    wg = B.wg_tile._pnex
    assert usage.arch_problem(wg.snapshot.function, (9, 0)) is None
    for arch in ("sm_80", "sm_89", "sm_100", "sm_120"):
        with pytest.raises(pnex.KernelDefinitionError,
                           match=rf"kernel 'wg_tile' calls pnex\.tc\.wgmma\w*, which exists on sm_90 only .*"
                                 rf"it cannot be compiled for {arch}"):
            wg.target_arch(arch)
    assert wg.target_arch("sm_90") == "sm_90"
    if not torch.cuda.is_available() and "PNEX_ARCH" not in __import__("os").environ:
        assert wg.target_arch() == "sm_90"  # the stand-in architecture becomes the one it needs
    mma = B.mma_len._pnex
    assert mma.target_arch("sm_100") == "sm_100"
    with pytest.raises(pnex.KernelDefinitionError, match=r"calls pnex\.tc\.mma, which needs sm_80 or newer"):
        mma.target_arch("sm_75")
    # store_pair converts with cvt.rn.f16x2.f32, which ptxas refuses below sm_80
    with pytest.raises(pnex.KernelDefinitionError, match=r"calls pnex\.tc\.store_pair, which needs sm_80 or newer"):
        B.pairs._pnex.target_arch("sm_75")


def test_saving_a_wgmma_kernel_for_another_architecture_is_refused_before_compiling():
    from pnex_magic.multiarch import build_images

    with pytest.raises(pnex.KernelDefinitionError, match=r"exists on sm_90 only .* cannot be compiled for sm_100"):
        build_images(B.wg_tile._pnex, ("sm_90", "sm_100"))


# ----------------------------------------------------------------------------------------------- gradients


def test_the_derived_backward_refuses_tensor_cores_by_line():
    line = line_of(B.mma_len, "af[r] = tc.pack_f16x2(")  # the first call of a primitive
    with pytest.raises(pnex.KernelDefinitionError,
                       match=rf"derive_backward\(mma_len\), line {line} \(`af\[r\] = tc\.pack_f16x2\(float32\(r\), "
                             rf"float32\(lane % 3\)\)`\): pnex\.tc\.pack_f16x2 \(tensor cores\) has no derivative rule: "
                             rf"derive_backward cannot differentiate it\. .*attach it with pnex\.attach_backward"):
        pnex.derive_backward(B.mma_len)
    with pytest.raises(pnex.KernelDefinitionError, match=rf"derive_backward\(wg_tile\), line \d+ .*pnex\.tc\.swizzle"):
        pnex.derive_backward(B.wg_tile)


def test_backward_auto_refuses_a_device_function_that_calls_tensor_cores():
    from numba import cuda, float32

    @cuda.jit(device=True)
    def warp_total(x):
        return tc.warp_sum(x)

    with pytest.raises(pnex.KernelDefinitionError,
                       match=r"pnex\.tc\.warp_sum \(tensor cores\) has no derivative rule.*the device function "
                             r"warp_total calls it at .*test_tc_checked_compile\.py:\d+"):
        @pnex.jit(n_threads=32, threads_per_block=32, backward="auto")
        def summed(x: pnex.In("f32", (32,)), y: pnex.Out("f32", (32,))):
            i = cuda.threadIdx.x
            y[i] = warp_total(x[i]) * float32(2.0)


# ----------------------------------------------------------------------------------------------- the examples' tiles


def test_the_gemm_example_refuses_shapes_its_tiles_do_not_divide_before_launching():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_mma import make_gemm

    from pnex_magic.report import _definition_of

    gemm = make_gemm("f16", 32, 32, 2)
    assert _definition_of(gemm, "test") is gemm._pnex  # pnex.inspect and the report see the op
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(32, 64, generator=gen).half(), torch.randn(64, 32, generator=gen).half()
    c = gemm(a, b)
    assert ((c.double() - a.double() @ b.double()).abs() <= (a.double() @ b.double()).abs() * 2**-10 + 1e-2).all()
    for bad_a, bad_b, pattern in (
        (torch.randn(33, 64), b, r"gemm\(\): the call breaks requires\[0\] `a\.size\(0\) % 32 == 0` \(a\.size\(0\) = "
                                 r"33\): M must be a multiple of the block tile BM = 32; the kernel computes whole tiles"),
        (a, torch.randn(64, 48), r"requires\[1\] `b\.size\(1\) % 32 == 0` \(b\.size\(1\) = 48\): N must be a "
                                 r"multiple of the block tile BN = 32"),
        (torch.randn(32, 48), torch.randn(48, 32), r"\(a\.size\(1\) = 48\): K must be a multiple of the k-tile BK"),
    ):
        with pytest.raises(pnex.ArgumentValueError, match=pattern):
            gemm(bad_a.half(), bad_b.half())
    compiled = torch.compile(lambda x, y: gemm(x, y) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(a, b), c * 2)
    with pytest.raises(Exception, match=r"\(a\.size\(1\) = 48\): K must be a multiple of the k-tile BK = 32"):
        compiled(torch.randn(32, 48).half(), torch.randn(48, 32).half())


def test_the_wgmma_and_attention_examples_refuse_shapes_their_tiles_do_not_divide():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_wgmma import make_linear

    linear = make_linear("f16", 64, 128, 2, pipelined=False, dynamic=False)
    w = torch.randn(128, 64).half()
    for a, weight, pattern in (
        (torch.randn(96, 64), w, r"\(a\.size\(0\) = 96\): M must be a multiple of the block tile BM = 64"),
        (torch.randn(64, 64), torch.randn(192, 64),
         r"\(w\.size\(0\) = 192\): N must be a multiple of the block tile BN = 128"),
        (torch.randn(64, 96), torch.randn(128, 96), r"\(a\.size\(1\) = 96\): K must be a multiple of the k-tile BK"),
        (torch.randn(64, 0), torch.randn(128, 0), r"`a\.size\(1\) % 64 == 0 and a\.size\(1\) >= 64` \(a\.size\(1\) = 0\): "
                                                  r"K must be a multiple of the k-tile BK = 64 and at least 64"),
    ):
        with pytest.raises(pnex.ArgumentValueError, match=pattern):
            linear(a.half(), weight.half())
    from attention import make_attention

    try:
        attention = make_attention("f16", 64)
    except TypeError as exc:  # pnex.jit(shared_bytes=...) is newer than this checkout
        pytest.skip(f"the attention example needs dynamic shared memory: {exc}")
    q = torch.randn(1, 1, 96, 64).half()
    with pytest.raises(pnex.ArgumentValueError, match=r"\(q\.size\(2\) = 96\): the query length must be a multiple"):
        attention(q, q, q, 0.125)
