"""``%%pnex --backward auto``: the cell's op gets its derived backward, the report shows its
source (the Signature tab's Backward section, and the text), and what cannot be derived
fails the cell at the line, keeping the previous binding.  A real IPython shell, kernels
through the CUDA simulator (as tests/test_magic_*.py)."""

from __future__ import annotations

import pytest
import torch

from pnex_magic.errors import KernelDefinitionError

IPython = pytest.importorskip("IPython")
from IPython.testing import globalipapp  # noqa: E402

SOFTPLUS = '''
import math

def softplus(x: In("f64", (None,)), w: In("f64", "x"), y: Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = math.log1p(math.exp(x[i] * w[i]))
'''

WHILE = '''
def softplus(x: In("f64", (None,)), w: In("f64", "x"), y: Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = x[i]
        while v > 1.0:
            v = v / 2.0
        y[i] = v * w[i]
'''


pytestmark = pytest.mark.usefixtures("fresh_cache")  # a private build cache per test (conftest.py)


@pytest.fixture(scope="module")
def ip():
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "pnex_magic")
    return shell


def test_backward_auto_derives_attaches_and_reports(ip):
    ip.run_cell_magic("pnex", "--n-threads x.numel() --threads-per-block 32 --backward auto -o rep", SOFTPLUS)
    op, report = ip.user_ns["softplus"], ip.user_ns["rep"]
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = torch.randn(7, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(7, dtype=torch.float64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(op, (x, w))
    source = op.backward_source
    assert source.startswith("def softplus_adjoint(") and "grad_y: pnex.In('float64'" in source
    html, text = report.to_html(), report.to_text()
    assert "<b>Backward</b>: derived from the kernel (--backward auto)" in html
    assert "backward kernel source" in html and "softplus_adjoint" in html
    assert "backward  : derived from the kernel (--backward auto): softplus_adjoint_" in text


def test_what_cannot_be_derived_fails_the_cell_at_its_line_and_keeps_the_binding(ip):
    ip.run_cell_magic("pnex", "--n-threads x.numel() --threads-per-block 32 --backward auto", SOFTPLUS)
    before = ip.user_ns["softplus"]
    with pytest.raises(KernelDefinitionError) as info:
        ip.run_cell_magic("pnex", "--n-threads x.numel() --threads-per-block 32 --backward auto", WHILE)
    assert str(info.value).startswith("cell line 7: --backward auto: derive_backward(softplus), line 7 "
                                      "(`while v > 1.0:`): while loops are not supported"), str(info.value)
    assert ip.user_ns["softplus"] is before
