"""The ping-pong GEMM (examples/tensor_cores/gemm_pingpong.py) without a GPU: in the
simulator, against float64 into poisoned outputs, with each warpgroup taking two tiles
of a block in turn; its machine code keeps the accumulators in registers; bad choices
and calls are refused.  On a GPU: test_tc_pingpong_gpu.py."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from toolchain import needs_nvvm

REPO = Path(__file__).resolve().parents[1]


def _pingpong():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    import gemm_pingpong

    return gemm_pingpong


def test_pingpong_gemm_on_cpu(poisoned):
    """Two blocks of four 128 x 128 tiles, two k-tiles each, through two buffers: a
    warpgroup's next tile uses the buffers in the same rounds' parity as two rounds
    before, so it must wait for the other warpgroup's turn (without the "turn" barrier
    the second tile of each first warpgroup read stale buffers: 32731 wrong elements)."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(512, 128, generator=gen).half()
    w = (torch.randn(256, 128, generator=gen) / 11).half()
    c = _pingpong().PingPongLinear("f16", 2)(a, w)
    ref = a.double() @ w.double().t()
    assert not c.isnan().any()
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 1e-3).all()


@pytest.mark.parametrize("cluster,tile", [(2, (128, 128)), (1, (64, 256))])
def test_pingpong_gemm_variants_on_cpu(cluster, tile, poisoned):
    """2-block clusters (each producer multicasts half of W's rows into both blocks, and
    a buffer is free once both blocks' consumers released it), and 64 x 256 tiles (one
    wgmma m64n256k16 a step): two tiles a warpgroup, through two buffers."""
    gen = torch.Generator().manual_seed(11 + cluster)
    m, n = (512, 256) if cluster == 2 else (256, 512)
    a = torch.randn(m, 128, generator=gen).half()
    w = (torch.randn(n, 128, generator=gen) / 11).half()
    c = _pingpong().PingPongLinear("f16", 2, cluster=cluster, tile=tile)(a, w)
    ref = a.double() @ w.double().t()
    assert not c.isnan().any()
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 1e-3).all()


@pytest.mark.parametrize("tile", [(128, 128), (64, 256)])
def test_pingpong_gemm_gelu_on_cpu(tile, poisoned):
    """The bias + GELU epilogue: each warpgroup applies it in registers and stages its tile
    64 columns at a time through the two halves of its own buffer, the bias of its next
    tile loaded during this one into the other of its two shared rows.  Two blocks, each
    warpgroup two tiles in different column blocks (so a bias row from the wrong tile, or
    the other warpgroup's, shows), through three buffers."""
    gen = torch.Generator().manual_seed(7)
    m, n = (256, 512) if tile == (128, 128) else (128, 2048)
    a = torch.randn(m, 192, generator=gen).bfloat16()
    w = (torch.randn(n, 192, generator=gen) / 14).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    c = _pingpong().PingPongLinear("bf16", 3, gelu=True, tile=tile)(a, w, bias)
    ref = F.gelu(a.double() @ w.double().t() + bias.double())
    assert not c.isnan().any()
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-8 + 2e-3).all()
    assert (c.double() - F.gelu(a.double() @ w.double().t())).abs().max() > 0.1  # the bias counts


def test_bias_only_epilogue_on_cpu(poisoned):
    """``activation="bias"`` (the benchmark's measure of what the GELU's arithmetic costs):
    the same epilogue, ``a @ w.T + bias`` and no GELU, in the ping-pong and TMA kernels."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_tma import TmaLinear

    gen = torch.Generator().manual_seed(9)
    a = torch.randn(256, 128, generator=gen).half()
    w = (torch.randn(256, 128, generator=gen) / 11).half()
    bias = torch.randn(256, generator=gen).half()
    ref = a.double() @ w.double().t() + bias.double()
    for lin in (_pingpong().PingPongLinear("f16", 2, gelu=True, activation="bias"),
                TmaLinear("f16", 256, 3, gelu=True, activation="bias")):
        c = lin(a, w, bias)
        assert not c.isnan().any()
        assert ((c.double() - ref).abs() <= ref.abs() * 2**-11 + 1e-3).all()
        assert (c.double() - F.gelu(ref)).abs().max() > 0.1  # no GELU


def test_an_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation must be one of gelu, gelu_poly, bias, got 'relu'"):
        _pingpong().make_linear_pingpong("f16", 2, gelu=True, activation="relu")


def test_pingpong_refuses_what_does_not_fit():
    mod = _pingpong()
    with pytest.raises(ValueError, match="stages must be 2 to 6 for 128 x 128 tiles .* got 7"):
        mod.make_linear_pingpong("f16", (6, 7))
    with pytest.raises(ValueError, match="stages must be 2 to 4 for 64 x 256 tiles .* got 5"):
        mod.make_linear_pingpong("f16", 5, tile=(64, 256))
    with pytest.raises(ValueError, match=r"tile must be \(128, 128\) or \(64, 256\)"):
        mod.make_linear_pingpong("f16", 4, tile=(128, 256))
    with pytest.raises(ValueError, match="cluster must be 1 or 2"):
        mod.make_linear_pingpong("f16", 4, cluster=4)
    lin = mod.PingPongLinear("f16", 2)
    a = torch.randn(128, 64).half()
    with pytest.raises(TypeError, match="bias is for the GELU epilogue"):
        lin(a, a, torch.zeros(128).half())
    with pytest.raises(TypeError, match="the GELU epilogue needs bias"):
        mod.PingPongLinear("f16", 2, gelu=True)(a, a)


def test_pingpong_refuses_shapes_its_tiles_do_not_divide():
    from pnex_magic import ArgumentValueError

    with pytest.raises(ArgumentValueError, match="N must be a multiple of the tile's columns = 128"):
        _pingpong().PingPongLinear("f16", 2)(torch.randn(128, 64).half(), torch.randn(192, 64).half())


@needs_nvvm
@pytest.mark.parametrize("tile", [(128, 128), (64, 256)])
@pytest.mark.parametrize("gelu", [False, True])
def test_pingpong_keeps_the_accumulators_in_registers(gelu, tile):
    """Two wgmma m64n128k16 (one m64n256k16) a step on the 128 accumulators of a tile, no
    local memory between the first and the last of them (the k-loop), and at most a few
    words of it anywhere: values the epilogue reloads once a tile (measured at sm_90a: 8
    and 0 bytes without the GELU, 72 and 16 with it, 128 x 128 and 64 x 256)."""
    from pnex_magic import sass
    from pnex_magic.report import _definition_of

    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump or nvdisasm here (pip install nvidia-cuda-cuobjdump, or the sass extra)")
    stages = 5 if tile == (128, 128) else 4
    compiled = _definition_of(_pingpong().make_linear_pingpong("f16", stages, gelu=gelu, tile=tile), "t")\
        .compiled("sm_90a")
    lines = sass.disassemble(compiled.cubin, entry=compiled.entry).text.splitlines()
    mma = "HGMMA.64x128x16.F32" if tile == (128, 128) else "HGMMA.64x256x16.F32"
    at = [i for i, line in enumerate(lines) if mma in line]
    assert at and len(at) % (8 if tile == (128, 128) else 4) == 0  # a k-tile's (ptxas may peel the first)
    assert not [line for line in lines[at[0]:at[-1]] if "LDL" in line or "STL" in line]
    assert compiled.resources.local_bytes <= (72 if gelu else 8)
