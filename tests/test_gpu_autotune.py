"""GPU tests of autotuning and of the report's bandwidth figures.

Skipped with a reason where no NVIDIA GPU is present (marker ``gpu``).  Both GPU
launchers are exercised: the C++ one (the choice made through its callback and
kept in its table) and the Python driver-API one."""

import json
import subprocess
import sys

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.launch import autotune

pytestmark = pytest.mark.gpu

TALL = (1_000_000, 4)  # 4 columns: a (16, 16) block leaves 12 of every 16 threads idle


@pytest.fixture(autouse=True)
def tuning(gpu_cache):
    """A private disk cache sharing the session's C++ launcher build (conftest's
    ``gpu_cache``), autotuning on, fresh counters and warnings."""
    fresh = gpu_cache
    autotune.stats.reset()
    autotune._WARNED.clear()
    yield fresh
    autotune.stats.reset()


def _scale_op():
    @pnex.jit(n_threads=("out.size(1)", "out.size(0)"), threads_per_block="auto")
    def scale2d(a: pnex.In("f32", (None, None)), out: pnex.Out("f32", "a")):
        x, y = cuda.grid(2)
        if y < out.shape[0] and x < out.shape[1]:
            out[y, x] = a[y, x] * 2.0

    return scale2d


def test_autotune_beats_the_default_block_on_a_tall_skinny_tensor(launcher):
    op = _scale_op()
    assert op._native == (launcher == "native")
    a = torch.randn(*TALL, device="cuda")
    out = op(a)
    torch.testing.assert_close(out, a * 2)
    result = autotune.result_for(op.definition, (a,))
    assert result.source == "benchmarked" and autotune.stats.benchmarks == 1
    assert result.key == (1 << 20, 4)
    rows = {c.block: c for c in result.candidates}
    # 1,000,000 rows / 8 per block = 125,000 blocks on Y: over CUDA's 65,535, so skipped
    assert "blocks on axis Y" in rows[(32, 8)].skipped
    assert rows[(16, 16)].seconds is not None and rows[(4, 64)].seconds is not None
    assert result.choice != 0 and result.speedup > 1, result.lines()
    # later calls reuse the choice, and stay right
    b = torch.randn(*TALL, device="cuda")
    torch.testing.assert_close(op(b), b * 2)
    assert autotune.stats.benchmarks == 1


def test_tuning_runs_on_copies_of_inmut_arguments(launcher):
    @pnex.jit(n_threads="x.numel()", threads_per_block=[256, 128, 512])
    def bump(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 1.0

    x = torch.zeros(100_000, device="cuda")
    bump(x)
    assert torch.equal(x, torch.ones_like(x))  # one increment, however often the tuner ran it
    assert autotune.stats.benchmarks == 1


def test_a_kernel_that_depends_on_its_block_shape_keeps_the_first_candidate(launcher):
    @pnex.jit(n_threads="a.numel()", threads_per_block=[128, 256, 64])
    def which_block(a: pnex.In("f32", (None,)), out: pnex.Out("i32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = cuda.blockDim.x

    a = torch.zeros(4096, device="cuda")
    out = which_block(a)
    assert torch.equal(out, torch.full_like(out, 128))
    result = autotune.result_for(which_block.definition, (a,))
    assert result.choice == 0
    assert all("differ from the first timed candidate's" in c.skipped for c in result.candidates[1:])


def test_graph_capture_never_benchmarks(launcher, caplog):
    op = _scale_op()
    op(torch.randn(64, 4, device="cuda"))  # loads the kernel (and tunes that key)
    tuned = autotune.stats.benchmarks
    a = torch.randn(3000, 4, device="cuda")  # another key, not tuned yet
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(a)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a * 2)
    assert autotune.stats.benchmarks == tuned and autotune.stats.fallbacks >= 1
    assert "not autotuned while a CUDA graph is being captured" in caplog.text
    # outside capture, the key is tuned on its next call
    torch.testing.assert_close(op(a), a * 2)
    assert autotune.stats.benchmarks == tuned + 1


def test_compiled_code_never_benchmarks(caplog):
    op = _scale_op()
    compiled = torch.compile(lambda t: op(t) + 1.0, fullgraph=True)
    a = torch.randn(3000, 4, device="cuda")
    torch.testing.assert_close(compiled(a), a * 2 + 1)
    assert autotune.stats.benchmarks == 0
    assert "torch.compile'd code" in caplog.text
    # a key tuned eagerly first is what compiled code then uses
    b = torch.randn(*TALL, device="cuda")
    op(b)
    assert autotune.stats.benchmarks == 1
    torch.testing.assert_close(compiled(b), b * 2 + 1)
    assert autotune.stats.benchmarks == 1


KERNEL_MODULE = '''
import pnex_magic as pnex
from numba import cuda

@pnex.jit(n_threads=("out.size(1)", "out.size(0)"), threads_per_block="auto")
def scale2d(a: pnex.In("f32", (None, None)), out: pnex.Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[y, x] * 2.0
'''

RUN = '''
import json, sys, torch
sys.path.insert(0, {folder!r})
import tall_kernel
from pnex_magic.launch import autotune
a = torch.randn({rows}, {cols}, device="cuda")
torch.testing.assert_close(tall_kernel.scale2d(a), a * 2)
result = autotune.result_for(tall_kernel.scale2d.definition, (a,))
print(json.dumps([autotune.stats.benchmarks, autotune.stats.disk_hits, result.block, result.source]))
'''


def test_the_choice_is_reused_by_a_new_process(tmp_path, pnex_env, tuning):
    (tmp_path / "tall_kernel.py").write_text(KERNEL_MODULE)
    env = {**pnex_env, "PNEX_CACHE_DIR": str(tuning)}
    script = RUN.format(folder=str(tmp_path), rows=TALL[0], cols=TALL[1])

    def run() -> list:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, again = run(), run()
    assert first[:2] == [1, 0] and first[3] == "benchmarked"
    assert again[:2] == [0, 1] and again[3].startswith("disk cache")
    assert again[2] == first[2]  # the same block


def test_report_shows_the_choice_and_the_bandwidth_ceilings():
    op = _scale_op()
    a = torch.randn(*TALL, device="cuda")
    report = pnex.build_report(op, args=(a,), eager=lambda t: t * 2, sass=False)
    assert report.autotune.source == "benchmarked"
    assert report.block[:2] == report.autotune.block
    e = report.efficiency
    assert e.copy_bandwidth > 1e11 and e.peak_bandwidth is not None and e.peak_bandwidth > e.copy_bandwidth / 2
    assert e.op_bandwidth == report.timing.bandwidth and 0 < e.op_of_copy
    text = str(report)
    assert "ceiling   : " in text and "memory    : torch's streaming kernels" in text and "autotune  :" in text
    assert e.ceiling >= max(e.memory_ceiling, e.eager_bandwidth)  # the fastest rate measured for the call
    # a transposed input is read across its contiguous axis: the report says so if slow
    at = torch.randn(4, TALL[0], device="cuda").t()
    strided = pnex.build_report(op, args=(at,), sass=False)
    if strided.efficiency.far:
        assert any(r.kind in ("uncoalesced", "narrow") for r in strided.efficiency.reasons), strided.efficiency
