"""``pnex.profile``, ``%%pnex --profile`` and the compute roofline on a GPU (issues 35, 36):
real kernels under Nsight Compute, with figures that must make sense for what each
kernel does.  Skipped without ncu (``pnex_magic.ncu.find_ncu``); where ncu cannot read
the counters (a sandboxed runtime), the test says so and skips."""

from __future__ import annotations

import inspect

import pytest
import torch
from numba import cuda, float32

import pnex_magic as pnex
from pnex_magic import ncu, profiling
from pnex_magic.errors import PnexError

pytestmark = pytest.mark.gpu


def _profile(op, *args) -> profiling.KernelProfile:
    if ncu.find_ncu() is None:
        pytest.skip("no Nsight Compute (ncu) here")
    try:
        return pnex.profile(op, *args)
    except profiling.ProfilerUnavailable as exc:
        pytest.skip(f"ncu cannot profile here: {exc}")
    except PnexError as exc:
        if "LibraryNotLoaded" in str(exc):
            pytest.skip(f"ncu cannot read the counters on this runtime: {exc}")
        raise


def _lines(op) -> dict[int, str]:
    source, first = inspect.getsourcelines(op._pnex.fn)
    return {first + k: line.strip() for k, line in enumerate(source)}


@pnex.jit(n_threads="a.numel()")
def copy(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = a[i]


@pnex.jit(n_threads="a.numel()", flops="2 * 512 * a.numel()")
def fma_chain(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        x = a[i]
        y = float32(0.5)  # float32 throughout: a Python float literal is a float64 in Numba (FP64 FMAs)
        for _ in range(512):
            y = y * x + float32(0.25)
        r[i] = y


@pnex.jit(n_threads="(a.numel() + ITEMS - 1) // ITEMS", threads_per_block=[128, 256])
def tuned_copy(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a"), ITEMS: pnex.Tune(1, 4)):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            r[j] = a[j]


def test_a_copy_is_memory_bound_and_its_copy_line_holds_the_samples():
    x = torch.rand(1 << 25, device="cuda")
    p = _profile(copy, x)
    f = p.figures
    # one 4-byte element a thread moves about half of what the DRAM can (benchmarks/profile_check.py on an
    # H200: the copy at 49% of memory speed of light, 32% compute): memory-bound, not at the ceiling
    assert f.memory_sol > 0.3 and f.memory_sol > 1.4 * f.compute_sol, str(p)
    assert 0 < f.achieved_occupancy <= f.theoretical_occupancy + 0.05 and f.theoretical_occupancy <= 1.0
    assert 1e-6 < f.duration < 1e-2 and f.stalls and all(0 < s.share < 1 for s in f.stalls)
    assert p.hot_lines, str(p)
    lines = _lines(copy)
    assert all(h.text == lines[h.line] for h in p.hot_lines if h.text)  # mapped to the kernel's own lines
    assert p.hot_lines[0].text == "r[i] = a[i]", str(p)
    assert p.report_path and p.version


def test_a_chain_of_fmas_is_compute_bound():
    x = torch.rand(1 << 22, device="cuda")
    p = _profile(fma_chain, x)
    f = p.figures
    assert f.compute_sol > f.memory_sol, str(p)
    assert {s.name for s in f.stalls[:2]} & {"wait", "math_pipe_throttle", "not_selected", "dispatch_stall"}, str(p)
    # The unrolled loop's samples go to its body or its header (the line table's choice: the
    # header on an H100 with CUDA 13), either way the loop, not the load or the store.
    assert p.hot_lines[0].text in ("for _ in range(512):", "y = y * x + float32(0.25)"), str(p)


def test_the_profiled_launch_is_the_one_the_autotuner_chose():
    x = torch.rand((1 << 24) + 3, device="cuda")
    tuned_copy(x)
    torch.cuda.synchronize()
    chosen = pnex.build_report(tuned_copy, args=(x,), sass=False).autotune
    p = _profile(tuned_copy, x)
    [kernel] = ncu.parse_raw(p.raw_csv)
    block = int(kernel.metric("launch__block_size"))
    grid = int(kernel.metric("launch__grid_size"))
    items = dict(chosen.candidates[chosen.choice].tune)["ITEMS"]
    assert block == chosen.block[0]
    assert grid == -(-(-(-x.numel() // items)) // block)


def test_the_compute_roofline_of_a_timed_call():
    x = torch.rand(1 << 24, device="cuda")  # 128 MiB moved: more than any L2, so the call is judged
    report = pnex.build_report(fma_chain, args=(x,), sass=False)
    c = report.compute
    assert c.flops == 2 * 512 * x.numel() and c.peak.kind == "fp32" and c.peak.flops > 1e12
    assert 0.01 < c.share < 1.0, "\n".join(c.lines())
    assert c.bound == "compute" and report.efficiency.explanation.kind == "compute"
    assert "compute-bound" in str(report)


def test_pnex_profile_cell_shows_a_profile_tab():
    IPython = pytest.importorskip("IPython")  # noqa: F841
    from IPython.testing import globalipapp

    if ncu.find_ncu() is None:
        pytest.skip("no Nsight Compute (ncu) here")
    ip = globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_cell("import torch\nx = torch.rand(1 << 24, device='cuda')")
    ip.run_cell_magic("pnex", "--n-threads a.numel() --args (x,) --eager torch.clone --profile -o rep", '''
def gpu_copy(a: In("f32", (None,)), r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = a[i]
''')
    rep = ip.user_ns["rep"]
    profile = rep.kernel.profile
    if not profile.ok:
        pytest.skip(f"not profiled: {profile.note}")
    tab = dict(rep.sections())["Profile"]
    assert "memory (speed of light)" in tab and "r[i] = a[i]" in tab
    assert "profile   : Nsight Compute" in rep.to_text()
