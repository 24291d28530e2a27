"""The fused epilogues' activations (examples/tensor_cores/epilogue.py) without a GPU:
``gelu_poly``'s polynomial, evaluated in float32 as the kernel does, against the GELU in
float64 on a dense grid; and the op through the simulator, into poisoned outputs."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]


def _epilogue():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    import epilogue

    return epilogue


def _gelu_poly_float32(x, ep):
    """:func:`epilogue.gelu_poly` step for step in float32 (numpy), exp2 correctly rounded."""
    f = np.float32
    a = np.minimum(np.abs(x), f(ep.GELU_CLAMP))
    p = f(ep.PHI_LOG2_COEFFS[7])
    for c in ep.PHI_LOG2_COEFFS[6::-1]:
        p = (p * a + f(c)).astype(f)
    q = np.exp2((p - x * x * f(ep.HALF_L2E)).astype(f)).astype(f)
    return (np.maximum(x, f(0)) - a * q).astype(f)


def test_gelu_poly_is_within_its_stated_error():
    """Relative error within 6.4e-6 for x >= -6 with exp2 exact (the docstring's 7e-6 leaves
    room for tc.exp2_approx's 2**-21), and |gelu(x)| < 6e-9 |x| below; a wrong coefficient or
    sign is far outside."""
    ep = _epilogue()
    x = np.linspace(-12, 12, 480_001, dtype=np.float64).astype(np.float32)
    exact = np.array([0.5 * float(v) * math.erfc(-float(v) / math.sqrt(2)) for v in x])
    got = _gelu_poly_float32(x, ep).astype(np.float64)
    kept = (x >= -6) & (exact != 0)
    rel = np.abs(got - exact)[kept] / np.abs(exact[kept])
    assert rel.max() < 6.5e-6, rel.max()
    assert (np.abs(got[x < -6]) <= 6e-9 * np.abs(x[x < -6])).all()
    # float16 outputs: as the correctly rounded GELU nearly everywhere (torch's float32 erf form
    # is not, below x = -3: 1 + erf cancels)
    differ = np.sum(got.astype(np.float16) != exact.astype(np.float16))
    assert differ < 0.002 * len(x), differ


@pytest.mark.parametrize("kernel", ["pingpong", "tma"])
def test_gelu_poly_epilogue_on_cpu(kernel, poisoned):
    """The op with ``activation="gelu_poly"`` in the simulator: GELU(a @ w.T + bias) within
    float16's rounding of the float64 product."""
    _epilogue()
    from gemm_pingpong import PingPongLinear
    from gemm_tma import TmaLinear

    gen = torch.Generator().manual_seed(13)
    a = torch.randn(256, 128, generator=gen).half()
    w = (torch.randn(256, 128, generator=gen) / 6).half()
    bias = torch.randn(256, generator=gen).half()
    lin = (PingPongLinear("f16", 2, gelu=True, activation="gelu_poly") if kernel == "pingpong" else
           TmaLinear("f16", 256, 3, gelu=True, activation="gelu_poly"))
    c = lin(a, w, bias)
    ref = F.gelu(a.double() @ w.double().t() + bias.double())
    assert not c.isnan().any()
    assert ((c.double() - ref).abs() <= ref.abs() * 2**-10 + 1e-4).all()
    assert (ref < -0.1).any() and (ref > 2).any()  # both sides of the GELU are exercised
