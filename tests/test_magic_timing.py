"""The timing behind the %%pnex report (pnex_magic.timing): loops and statistics, speed-up and
bandwidth, the comparison with eager and its worst element, on CPU with a fake timer; the GPU path.

Every test drives a real IPython shell (``run_line_magic`` / ``run_cell_magic``
/ ``run_cell``) and asserts on ``user_ns``, on the report and its renderings, and
on the errors (tests/test_browser.py looks at the report in a browser).  Kernels run on CPU tensors
through numba-cuda's CUDA simulator, so sizes stay tiny (one 32-thread block).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from pnex_magic import timing

from magic_helpers import COPY, ip, magic_cache, run  # noqa: F401 (fixtures: ip, magic_cache)

IPython = pytest.importorskip("IPython")


# --------------------------------------------------------------------------- timing (statistics on CPU)


class FakeTimer:
    """Each call of fn costs `per_call` seconds, plus `jitter[i]` on run i."""

    def __init__(self, per_call, jitter=()):
        self.per_call = per_call
        self.jitter = list(jitter)
        self.calls = []

    def __call__(self, fn, loops):
        self.calls.append(loops)
        extra = self.jitter.pop(0) if self.jitter and len(self.calls) > 2 else 0.0
        return loops * self.per_call + extra


def test_measure_picks_loops_and_computes_statistics():
    timer = FakeTimer(10e-6)
    m = timing.measure(lambda: None, timer, repeat=5, warmup=3, min_run_seconds=1e-3)
    assert timer.calls[:2] == [3, 1]  # warm-up, then a one-call probe
    assert m.loops == 100 and m.repeat == 5 and len(m.all_runs) == 5 and timer.calls[2:] == [100] * 5
    assert m.median == pytest.approx(10e-6) and m.iqr == pytest.approx(0) and m.best == pytest.approx(10e-6)
    timer = FakeTimer(1e-6, jitter=[0, 1e-4, 2e-4, 3e-4, 4e-4])
    m = timing.measure(lambda: None, timer, repeat=5, loops=100, warmup=0)
    per_call = sorted(m.timings)
    assert m.median == pytest.approx(per_call[2]) and m.best == pytest.approx(per_call[0])
    assert m.q1 == pytest.approx(per_call[1]) and m.q3 == pytest.approx(per_call[3])
    assert m.iqr == pytest.approx(per_call[3] - per_call[1]) and m.worst == pytest.approx(per_call[4])
    assert "5 runs × 100 loops" in str(m) and "µs" in str(m)
    assert timing._nice_loops(3) == 5 and timing._nice_loops(11) == 20 and timing._nice_loops(1e5) == 100000
    with pytest.raises(ValueError):
        timing.measure(lambda: None, timer, repeat=0)


def test_timing_result_speedup_bandwidth_and_text():
    op = timing.Measurement(loops=10, repeat=3, all_runs=(10e-5, 10e-5, 12e-5))
    eager = timing.Measurement(loops=10, repeat=3, all_runs=(20e-5, 20e-5, 20e-5))
    c = timing.Correctness(0.0, 0.0, True, ("result",), 1.3e-6, 1e-5)
    r = timing.TimingResult(op, eager, c, bytes_moved=8_000_000, device="cuda:0 (Fake GPU)", name="copy",
                            eager_name="torch.clone")
    assert r.speedup == pytest.approx(2.0) and r.bandwidth == pytest.approx(8e6 / 10e-6)
    text = str(r)
    assert "speed-up  : 2.00×" in text and "800 GB/s" in text and "copy" in text and "torch.clone" in text
    none = timing.TimingResult(None, None, c, 0, "cpu (CUDA simulator)", reason="no GPU")
    assert none.speedup is None and none.bandwidth is None and "not timed : no GPU" in str(none)


def test_compare_outputs():
    a = torch.tensor([1.0, 2.0, 4.0])
    assert timing.compare_outputs([a], [a.clone()], ["r"]).ok
    c = timing.compare_outputs([a], [torch.tensor([1.0, 2.5, 4.0])], ["r"])
    assert not c.ok and c.max_abs_error == pytest.approx(0.5) and c.max_rel_error == pytest.approx(0.2)
    c = timing.compare_outputs([torch.tensor([0.0, float("nan")])], [torch.tensor([1e-9, float("nan")])], ["r"])
    assert c.ok and c.max_abs_error == pytest.approx(1e-9)  # NaN where eager has NaN is a match
    assert not timing.compare_outputs([a], [a[:2]], ["r"]).ok
    assert not timing.compare_outputs([a], [a, a], ["r"]).ok
    ints = torch.tensor([1, 2, 3])
    assert not timing.compare_outputs([ints], [ints + 1], ["i"]).ok  # integers must match exactly
    assert timing.compare_outputs([a.half()], [a.double()], ["h"]).note  # dtype differences are noted


def test_a_pass_reads_as_a_pass_and_a_failure_names_the_worst_element():
    """Near zero, one rounding is a large relative error: the check passes, and the block says
    so with the largest difference against the reference's scale.  A poisoned element fails
    it, and is named with both values."""
    gen = torch.Generator().manual_seed(30)
    ref = torch.randn(64, 48, generator=gen, dtype=torch.float64)
    ref[3, 5] = 1e-9  # an element near zero
    out = ref.to(torch.float32)
    out[3, 5] = 1.05e-9  # within atol, 5% relative
    c = timing.compare_outputs([out], [ref.to(torch.float32)], ["result"])
    assert c.ok and c.max_rel_error > 0.04 and c.mismatched == 0 and c.worst is None and c.elements == 64 * 48
    assert c.scaled_error == pytest.approx(c.max_abs_error / float(ref.abs().max()), rel=1e-6) and c.scaled_error < 1e-8
    assert str(c).startswith("matches eager: all 3,072 elements of result within rtol=1.3e-06, atol=1e-05")
    from pnex_magic.render.report import correctness_html

    html = correctness_html(c)
    assert "matches eager" in html and "max rel error" not in html and "of the largest reference value" in html
    bad = out.clone()
    row, col = torch.randint(0, 64, (1,), generator=gen).item(), torch.randint(0, 48, (1,), generator=gen).item()
    bad[row, col] += 0.5
    bad[0, 0] += 1e-4  # also outside the tolerance, by less
    c = timing.compare_outputs([bad], [out], ["result"])
    assert not c.ok and c.mismatched == 2 and c.worst.index == (row, col)
    assert c.worst.actual == pytest.approx(float(bad[row, col])) and c.worst.expected == pytest.approx(float(out[row, col]))
    assert f"worst: result[{row}, {col}] = {float(bad[row, col]):.6g} where eager gives {float(out[row, col]):.6g}" in str(c)
    html = correctness_html(c)
    assert "DIFFERS from eager" in html and "2 of 3,072 elements of result" in html and f"result[{row}, {col}]" in html
    # several outputs: the worst over all of them; a mutated argument keeps its own name
    c = timing.compare_outputs([out, bad], [out, out], ["x (mutated)", "y"])
    assert c.worst.output == "y" and str(c.worst).startswith(f"y[{row}, {col}] = ")


def test_a_failure_is_located_without_importing_sympy():
    """A fresh notebook's first report of a kernel that disagrees with eager paid 1-2 s for
    sympy (``torch.unravel_index`` imports torch's symbolic shapes): the worst element's
    index is found in plain Python, in a process that has not imported sympy."""
    code = (
        "import sys, torch\n"
        "from pnex_magic import timing\n"
        "assert 'sympy' not in sys.modules\n"
        "ref = torch.zeros(3, 5, 7)\n"
        "bad = ref.clone(); bad[2, 1, 4] = 1.0; bad[0, 0, 0] = 0.5\n"
        "c = timing.compare_outputs([bad], [ref], ['r'])\n"
        "print(c.worst.index, c.mismatched, 'sympy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-5:] == ["(2,", "1,", "4)", "2", "False"]


def test_evaluate_times_with_any_timer_and_checks_correctness(ip):
    run(ip, "--n-threads a.numel() --threads-per-block 32", COPY)
    op = ip.user_ns["copy_k"]
    x = torch.arange(4, dtype=torch.float32)
    timer = FakeTimer(5e-6)
    r = timing.evaluate(op, (x,), torch.clone, output_names=["result"], time_it=True, timer=timer, repeat=3)
    assert r.op is not None and r.eager is not None and r.correctness.ok
    assert r.bytes_moved == 2 * 4 * 4 and r.speedup == pytest.approx(1.0)
    untimed = timing.evaluate(op, (x,), torch.clone, output_names=["result"])
    assert untimed.op is None and untimed.reason and untimed.correctness.ok


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_timing_path(ip):
    ip.run_cell("xg = torch.arange(1 << 20, dtype=torch.float32, device='cuda')")
    run(ip, "--n-threads a.numel() --args (xg,) --eager torch.clone -o rep", COPY)
    t = ip.user_ns["rep"].timing
    assert t.op is not None and t.eager is not None and t.op.median > 0 and t.bandwidth > 0
    assert t.correctness.ok and "cuda" in t.device
