"""Checked launches of tensor-core kernels on a GPU (marker ``gpu``): each planted
violation of tests/tc_bad_kernels.py is recorded on the hardware with the rule and the
operand the simulator names (tests/test_tc_checked_simulator.py), the launch raises
KernelIndexError, and the CUDA context stays usable; correct kernels, the examples
included, give the fast variant's results bit for bit when checked.

    python -m pytest -q -p no:cacheprovider tests/test_tc_checked_gpu.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import pnex_magic as pnex
from pnex_magic.launch import checks
from pnex_magic.tc import rules

sys.path.insert(0, str(Path(__file__).parent))
import tc_bad_kernels as B  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]


def _needs(cc):
    have = torch.cuda.get_device_capability()
    if have < cc or (cc == (9, 0) and have != (9, 0)):
        pytest.skip(f"needs sm_{cc[0]}{cc[1]}{' exactly (wgmma)' if cc == (9, 0) else ' or newer'}, this GPU is "
                    f"sm_{have[0]}{have[1]}")


def checked(op, *args, **kwargs):
    with checks.checked_launches(op._pnex):
        out = op(*args, **kwargs)
    if out.is_cuda:
        torch.cuda.synchronize()
    return out


def on_gpu(call, op, tensors, args):
    """``call(op, *tensors, **args)`` with the tensors on the GPU (and the outputs of an op
    that takes none: pairs)."""
    with torch.device("cuda"):
        return call(op, *(t.cuda() for t in tensors), **args)


def plain(op, *args, **kwargs):
    return op(*args, **kwargs)


def _tensors(name):
    gen = torch.Generator().manual_seed(7)
    if name == "cp_tile":
        return (torch.randn(16, 64, generator=gen).half(),)
    if name == "ld_tile":
        return (torch.randn(32, 16, generator=gen).half(),)
    if name == "mma_len":
        return (torch.randn(32, 4, generator=gen),)
    if name == "pairs":
        return ()
    return torch.randn(64, 64, generator=gen).half(), torch.randn(16, 64, generator=gen).half()


#: (kernel, arguments changed from GOOD, the rule, the operand's site, its variable)
VIOLATIONS = [
    ("cp_tile", dict(col_shift=1), rules.ALIGN, "pnex.tc.cp_async destination", "s"),
    ("cp_tile", dict(col_shift=16), rules.BOUNDS, "pnex.tc.cp_async destination", "s"),
    ("cp_tile", dict(row_shift=1), rules.BOUNDS, "pnex.tc.cp_async source", "src"),
    ("ld_tile", dict(shift=1, bad_from=15), rules.RANGE, "pnex.tc.ldmatrix tile", "s"),
    ("ld_tile", dict(shift=8, bad_from=0), rules.BOUNDS, "pnex.tc.ldmatrix tile", "s"),
    ("ld_tile", dict(n=1), rules.FRAGMENT, "pnex.tc.ldmatrix fragment", "frag[0:n]"),
    ("mma_len", dict(nc=3), rules.FRAGMENT, "pnex.tc.mma accumulator", "acc[0:nc]"),
    ("mma_len", dict(na=5), rules.FRAGMENT, "pnex.tc.mma A fragment", "af[0:na]"),
    ("mma_len", dict(nb=3), rules.FRAGMENT, "pnex.tc.mma B fragment", "bf[0:nb]"),
    ("pairs", dict(shift=1), rules.ALIGN, "pnex.tc.store_pair array", "out"),
    ("pairs", dict(shift=4), rules.BOUNDS, "pnex.tc.store_pair array", "out"),
    ("wg_tile", dict(r0=4), rules.MULTIPLE, "pnex.tc.wgmma A tile", "sa"),
    ("wg_tile", dict(c0=8), rules.MULTIPLE, "pnex.tc.wgmma A tile", "sa"),
    ("wg_tile", dict(r0=8), rules.RANGE, "pnex.tc.wgmma A tile", "sa"),
    ("wg_tile", dict(m=7), rules.FRAGMENT, "pnex.tc.wgmma accumulator", "acc[0:m]"),
    ("wg_tile", dict(plane=1), rules.ALIGN, "pnex.tc.wgmma A tile", "sa"),
    ("wg_tile", dict(which=1), rules.RANGE, "pnex.tc.wgmma B tile", "sb8"),
    ("wg_tile", dict(which=2), rules.ROWS, "pnex.tc.wgmma B tile", "sb32"),
]


@pytest.mark.parametrize("name, change, code, operand, variable", VIOLATIONS,
                         ids=[f"{v[0]}-{'-'.join(f'{k}{x}' for k, x in v[1].items())}" for v in VIOLATIONS])
def test_a_violation_is_recorded_on_the_gpu_as_in_the_simulator(name, change, code, operand, variable):
    _needs((9, 0) if name == "wg_tile" else (8, 0))
    op = getattr(B, name)
    args = {**B.GOOD[name], **change}
    cpu = _tensors(name)
    with pytest.raises(pnex.KernelIndexError) as on_cpu:
        checked(op, *cpu, **args)
    with pytest.raises(pnex.KernelIndexError) as found:
        on_gpu(checked, op, cpu, args)
    error = found.value
    assert (rules.unpack(error.violation.rule)[0], error.site.operand, error.site.variable) == (code, operand, variable)
    simulated = on_cpu.value
    assert (error.violation.rule, error.violation.axis, error.site) == (
        simulated.violation.rule, simulated.violation.axis, simulated.site)  # the same words, maybe another thread
    # the context is intact: the correct call runs and equals the simulator's
    good = on_gpu(plain, op, cpu, B.GOOD[name]).cpu()
    if name in ("cp_tile", "ld_tile", "pairs"):
        assert torch.equal(good, op(*cpu, **B.GOOD[name]))


def test_a_misaligned_tensor_is_recorded_on_the_gpu():
    _needs((8, 0))
    src = torch.randn(16 * 64 + 1, device="cuda").half()[1:].view(16, 64)
    with pytest.raises(pnex.KernelIndexError,
                       match=r"pnex\.tc\.cp_async source: parameter 'src' \(shape \(16, 64\)\) itself starts 2 bytes past "
                             r"a 16-byte boundary"):
        checked(B.cp_tile, src, **B.GOOD["cp_tile"])


@pytest.mark.parametrize("name", ["cp_tile", "ld_tile", "mma_len", "pairs", "wg_tile"])
def test_correct_kernels_give_the_same_bits_checked_and_fast(name):
    _needs((9, 0) if name == "wg_tile" else (8, 0))
    op = getattr(B, name)
    fast = on_gpu(plain, op, _tensors(name), B.GOOD[name])
    assert fast.is_cuda
    assert torch.equal(on_gpu(checked, op, _tensors(name), B.GOOD[name]), fast)


def test_an_undeclared_alignment_is_refused_on_cpu_and_checked_by_address_on_the_gpu():
    """The simulator knows only the declared alignment (2 bytes: refused); the GPU checks
    where the tile landed: recorded if it is off, the right words if not."""
    _needs((8, 0))
    tile = torch.randn(32, 16).half()
    try:
        words = checked(B.ld_undeclared, tile.cuda())
    except pnex.KernelIndexError as exc:
        assert rules.unpack(exc.violation.rule)[0] == rules.ALIGN and exc.site.variable == "s"
    else:
        assert words.shape == (32, 4)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_examples_run_checked_with_the_fast_variants_bits(dtype):
    _needs((8, 0))
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_mma import make_gemm

    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(8)
    a = torch.randn(256, 128, device="cuda", dtype=tdt, generator=gen)
    b = torch.randn(128, 256, device="cuda", dtype=tdt, generator=gen)
    gemm = make_gemm(dtype)
    assert torch.equal(checked(gemm, a, b), gemm(a, b))
    if torch.cuda.get_device_capability() == (9, 0):
        from gemm_wgmma import make_linear

        linear = make_linear(dtype, 64, 128, 2, pipelined=False, dynamic=False)
        w = torch.randn(128, 128, device="cuda", dtype=tdt, generator=gen)
        a = torch.randn(128, 128, device="cuda", dtype=tdt, generator=gen)
        assert torch.equal(checked(linear, a, w), linear(a, w))


#: Arguments at the edge of a rule, on its good side (an off-by-one in a GPU check fails here).
EDGES = [
    ("cp_tile", dict(col_shift=8)),  # the last chunk ends at column 72 of 72
    ("cp_tile", dict(row_shift=1, valid_rows=15)),  # row 16 of the source is not valid: not read, not checked
    ("ld_tile", dict(shift=1, bad_from=16)),  # x2 reads the addresses of lanes 0-15 only
    ("pairs", dict(shift=2)),  # the last pair at columns 16, 17 of 18
    ("wg_tile", dict(c0=48)),  # the last 16 columns of 64
]


@pytest.mark.parametrize("name, change", EDGES, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in c.items())}" for n, c in EDGES])
def test_the_edges_of_the_rules_pass_on_the_gpu_as_in_the_simulator(name, change):
    _needs((9, 0) if name == "wg_tile" else (8, 0))
    op = getattr(B, name)
    args = {**B.GOOD[name], **change}
    cpu = checked(op, *_tensors(name), **args)
    gpu = on_gpu(checked, op, _tensors(name), args).cpu()
    if name == "wg_tile":
        torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(gpu, cpu)
