"""Autotuning and "how close to the limit", without a GPU.

The candidate lists and key expressions are checked like every other option; the
tuner's decisions (which candidates it skips, which it keeps, what it stores on
disk and reuses, when it refuses to benchmark) are driven with a fake runner and
a fake clock; the simulator runs the first candidate.  The explanations of a slow
kernel are in ``tests/test_efficiency.py``; GPU behaviour is in
``tests/test_gpu_autotune.py``.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import cache, hardware
from pnex_magic.blocks import AUTO_CANDIDATES, DEFAULT_BLOCK, bucket
from pnex_magic.compiler import ResourceUsage
from pnex_magic.define import definition as make_definition
from pnex_magic.definition import JitOptions
from pnex_magic.errors import KernelDefinitionError
from pnex_magic.launch import autotune
from pnex_magic.launch.description import describe_launch
from pnex_magic.render.tuning import autotune_html


def scale_kernel(a: pnex.In("f32", (None, None)), s: int, out: pnex.Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[y, x] * s


def block_shape(a: pnex.In("f32", (None, None)), out: pnex.Out("i32", "a")):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = cuda.blockDim.x * 100 + cuda.blockDim.y


GRID2 = ("out.size(1)", "out.size(0)")


def tuned(fn=scale_kernel, **options):
    options.setdefault("n_threads", GRID2)
    options.setdefault("threads_per_block", "auto")
    return pnex.jit(**options)(fn)


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_auto_lists_the_documented_candidates_default_first(ndim):
    def k(a: pnex.In("f32", (None, None, None)), out: pnex.Out("f32", "a")):
        pass

    n_threads = ("a.size(2)", "a.size(1)", "a.size(0)")[:ndim]
    spec = pnex.jit(n_threads=n_threads, threads_per_block="auto")(k).spec
    assert spec.autotuned and spec.candidates == AUTO_CANDIDATES[ndim]
    assert spec.threads_per_block == DEFAULT_BLOCK[ndim] == spec.candidates[0]
    assert all(len(c) == ndim and math.prod(c) <= 1024 for c in spec.candidates)


def test_explicit_candidates_ints_tuples_and_duplicates():
    spec = tuned(threads_per_block=[(32, 8), (16, 16), (32, 8), [4, 64]]).spec
    assert spec.candidates == ((32, 8), (16, 16), (4, 64))  # a repeat is timed once
    assert spec.threads_per_block == (32, 8)

    def flat(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    one_d = pnex.jit(n_threads="a.numel()", threads_per_block=[128, (512,), 256])(flat).spec
    assert one_d.candidates == ((128,), (512,), (256,))
    # one candidate is a fixed block, not autotuning
    fixed = pnex.jit(n_threads="a.numel()", threads_per_block=[64])(flat).spec
    assert not fixed.autotuned and fixed.threads_per_block == (64,) and fixed.block_candidates == ((64,),)


@pytest.mark.parametrize(
    "value, pattern",
    [
        ([128, 256], r"candidate 0 \(128\) is an int but the launch has 2 axes.*pass a tuple, not a list"),
        ([(16, 16), (64, 64)], r"candidate 1 \(\(64, 64\)\) makes 4096 threads per block"),
        ([(16, 16), (8, 8, 2)], r"candidate 1 .* has 3 dimension\(s\) but n_threads has 2"),
        ([(16, 0)], r"entries must be positive ints, got candidate 0"),
        ([], r"=\[\] lists no candidates"),
        ("fastest", r"='fastest'; expected an int, a tuple .*'auto'"),
        ([(1, 1)] * 2 + [(i, 1) for i in range(2, 40)], r"lists 40 candidates; at most 32"),
    ],
)
def test_bad_candidates_name_the_option(value, pattern):
    with pytest.raises(KernelDefinitionError, match=r"^kernel 'scale_kernel': threads_per_block.*" + pattern):
        tuned(threads_per_block=value)


@pytest.mark.parametrize(
    "key, pattern",
    [
        (("out.size(0)",), r"autotune_key\[0\] \(over the op's arguments\): unknown name 'out'"),
        (("a.size(2)",), r"autotune_key\[0\].*axis 2 is out of range"),
        (("a.size(0) * 1.5",), r"autotune_key\[0\].*only integer constants"),
        ({"a": 1}, r"autotune_key must be an expression or a tuple of them"),
    ],
)
def test_bad_autotune_key_names_the_option(key, pattern):
    with pytest.raises(KernelDefinitionError, match=pattern):
        tuned(autotune_key=key)


def test_autotune_key_needs_candidates():
    with pytest.raises(KernelDefinitionError, match=r"autotune_key=\('a.size\(0\)',\) is given but there is nothing"):
        tuned(threads_per_block=(16, 16), autotune_key=("a.size(0)",))


def test_key_values_default_buckets_and_named_expressions():
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 5, 1000, 1024, 1025)] == [0, 1, 2, 4, 4, 8, 1024, 1024, 2048]
    spec = tuned().spec
    exprs, bucketed = spec.tuning_key()
    assert bucketed and [str(e) for e in exprs] == ["a.size(0)", "a.size(1)"]
    env = {"a": torch.empty(1000, 3), "s": 7}
    assert autotune.key_values(spec, env) == (1024, 4)
    named = tuned(autotune_key=("a.size(1)", "s * 2")).spec
    assert autotune.key_values(named, env) == (3, 14)  # exact values, not bucketed
    assert "a.size(1)=3, s * 2=14" in autotune.key_text(named, (3, 14), "C")
    assert "rounded up to powers of two" in autotune.key_text(spec, (1024, 4), "A")


def test_launch_description_carries_candidates_and_key():
    spec = tuned(autotune_key="a.size(0) // 2").spec
    d = describe_launch(spec)
    assert d["block"] == [16, 16, 1] and d["candidates"][0] == [16, 16, 1, 0]  # block, Tune variant
    assert d["candidates"] == [list(c) + [1, 0] for c in AUTO_CANDIDATES[2]]
    assert d["key_text"] == ["a.size(0) // 2"] and d["key_bucket"] is False and len(d["key"]) == 1
    fixed = describe_launch(tuned(threads_per_block=(8, 4)).spec)
    assert fixed["candidates"] == [[8, 4, 1, 0]] and fixed["key"] == [] and fixed["key_bucket"] is True


def test_candidates_change_the_kernel_fingerprint_not_a_fixed_kernels():
    fixed = tuned(threads_per_block=(16, 16)).spec
    assert "candidates" not in fixed.describe()
    assert "candidates=((16, 16), (32, 8))" in tuned(threads_per_block=[(16, 16), (32, 8)]).spec.describe()


# --------------------------------------------------------------------------- limits


def test_block_problem_from_registers_shared_memory_and_grid():
    assert hardware.block_problem("sm_90", 64, 0, (1024,)) is None  # exactly 65,536 registers
    problem = hardware.block_problem("sm_90", 65, 0, (1024,))
    assert "73,728 registers per block (65 per thread × 1024 threads)" in problem
    assert "static shared memory" in hardware.block_problem("sm_90", 16, 50_000, (128,))
    assert hardware.block_problem("sm_90", None, None, (256, 1), (10, 100_000)).startswith(
        "needs 100,000 blocks on axis Y for this call"
    )
    assert hardware.block_problem("sm_90", 32, 1024, (16, 16), (10, 100_000)) is None


def test_occupancy_limiter_names_the_resource():
    assert hardware.occupancy_limiter("sm_90", 96, 0, 256) == (0.25, "registers")
    assert hardware.occupancy_limiter("sm_90", 16, 100_000, 256) == (0.25, "shared memory")
    occ, limiter = hardware.occupancy_limiter("sm_86", 16, 0, 32)
    assert limiter == "blocks" and occ == pytest.approx(16 / 48)
    assert hardware.occupancy("sm_90", 32, 0, 256) == 1.0


def test_peak_bandwidth_from_clock_and_bus():
    assert hardware.peak_bandwidth(2_619_000, 5120) == pytest.approx(3.352e12, rel=1e-3)  # H100 SXM
    assert hardware.peak_bandwidth(None, 5120) is None


# --------------------------------------------------------------------------- the tuner


class FakeRunner:
    """Runs "candidates" on the CPU: each returns what ``outputs`` says and takes
    ``times[block]`` seconds on the fake clock."""

    def __init__(self, spec, times, outputs=None, failing=()):
        self.spec, self.times, self.outputs, self.failing = spec, times, outputs or {}, failing
        self.runs: list[tuple[int, ...]] = []
        self.resets = 0

    def runner(self):
        return autotune.Runner(self.run, self.reset, lambda variant: (4, 4096), torch.device("cpu"))

    def run(self, index):
        block = self.spec.launch_candidates[index][0]
        self.runs.append(block)
        if block in self.failing:
            raise RuntimeError("pnex: kernel 'scale_kernel' could not be launched: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
        return [torch.full((3,), self.outputs.get(block, 1.0))]

    def reset(self):
        self.resets += 1

    def seconds(self, call, device):
        call()
        return self.times[self.runs[-1]]


@pytest.fixture
def fake_gpu(monkeypatch, fresh_cache):
    """The tuner on a pretend "Fake GPU" (sm_90) whose kernel uses 80 registers per thread."""
    monkeypatch.setattr(autotune, "_device_facts", lambda index: ("Fake GPU", "sm_90"))
    resources = ResourceUsage(80, 0, 0, 0, 0, 0, 0, 0)
    monkeypatch.setattr(autotune, "_resources", lambda definition, arch, layout, variant=0: resources)
    monkeypatch.delenv("PNEX_AUTOTUNE", raising=False)
    autotune.stats.reset()
    yield fresh_cache
    autotune.stats.reset()


CANDIDATES = [(16, 16), (32, 8), (4, 64), (32, 32), (256, 1)]


def _definition(**options):
    return make_definition(
        scale_kernel, n_threads=GRID2, threads_per_block=CANDIDATES, options=JitOptions(**options)
    )


def _choose(definition, fake, monkeypatch, key=(4096, 4), **kwargs):
    monkeypatch.setattr(autotune, "_device_seconds", fake.seconds)
    kwargs.setdefault("capturing", False)
    return autotune.choose(definition, device_index=0, layout="C", key=key, runner=fake.runner, **kwargs)


def test_tuner_skips_what_cannot_run_or_differs_and_keeps_the_fastest(fake_gpu, monkeypatch):
    d = _definition()
    times = {(16, 16): 4e-6, (32, 8): 0.5e-6, (4, 64): 1e-6, (32, 32): 0.1e-6, (256, 1): 0.2e-6}
    # (32, 8) gives other results (as a kernel that assumes its block shape would), (32, 32)
    # needs 80 x 1024 registers, (256, 1) fails to launch.
    fake = FakeRunner(d.spec, times, outputs={(32, 8): 2.0}, failing={(256, 1)})
    choice, final = _choose(d, fake, monkeypatch)
    assert (d.spec.block_candidates[choice], final) == ((4, 64), True)
    assert autotune.stats.benchmarks == 1
    result = autotune._RESULTS[d][(0, "C", (4096, 4))]
    rows = {c.block: c for c in result.candidates}
    assert "registers per block" in rows[(32, 32)].skipped and rows[(32, 32)].block not in fake.runs
    assert "differ from the first timed candidate's (max abs difference 1)" in rows[(32, 8)].skipped
    assert rows[(256, 1)].skipped.startswith("launch failed: pnex: kernel 'scale_kernel' could not be launched")
    assert rows[(16, 16)].seconds == 4e-6 and rows[(4, 64)].seconds == 1e-6
    assert result.source == "benchmarked" and result.speedup == pytest.approx(4.0)
    assert fake.resets == 4  # every candidate that ran started from fresh copies
    # answered from memory afterwards: nothing runs
    assert _choose(d, FakeRunner(d.spec, {}), monkeypatch) == (choice, True)
    assert autotune.stats.benchmarks == 1
    [record] = cache.records(autotune.RECORD_KIND)
    assert record.data["choice"] == [4, 64] and record.data["gpu"] == "Fake GPU"
    assert record.data["key_values"] == [4096, 4] and record.data["kernel"].endswith("scale_kernel")


def test_choice_is_reused_from_disk_and_force_times_again(fake_gpu, monkeypatch):
    times = dict.fromkeys(CANDIDATES, 2e-6) | {(32, 8): 1e-6}
    first = _definition()
    choice, _ = _choose(first, FakeRunner(first.spec, times), monkeypatch)
    assert first.spec.block_candidates[choice] == (32, 8)

    class Untouchable(FakeRunner):
        def run(self, index):
            raise AssertionError("benchmarked again")

    # A new process defines the same kernel: the same build, so the stored choice is used.
    again = _definition()
    assert _choose(again, Untouchable(again.spec, {}), monkeypatch) == (choice, True)
    assert (autotune.stats.benchmarks, autotune.stats.disk_hits) == (1, 1)
    reused = autotune._RESULTS[again][(0, "C", (4096, 4))]
    assert reused.source.startswith("disk cache") and reused.candidates[choice].seconds == 1e-6
    # another key, another GPU model or another candidate list is another slot
    assert _choose(again, FakeRunner(again.spec, times), monkeypatch, key=(8192, 4)) == (choice, True)
    assert autotune.stats.benchmarks == 2
    # %%pnex --force times again and overwrites the record
    forced = _definition(force=True)
    faster = dict.fromkeys(CANDIDATES, 2e-6) | {(4, 64): 1e-6}
    choice, _ = _choose(forced, FakeRunner(forced.spec, faster), monkeypatch)
    assert forced.spec.block_candidates[choice] == (4, 64) and autotune.stats.benchmarks == 3
    assert _choose(_definition(), Untouchable(forced.spec, {}), monkeypatch)[0] == choice


def test_with_the_cache_off_choices_are_neither_read_nor_stored(fake_gpu, monkeypatch):
    """A kernel whose options turn the cache off (``use_cache=False``) times its
    candidates in each process, as if no choice were on disk, and stores none; the
    choice is kept in the process all the same."""
    times = dict.fromkeys(CANDIDATES, 2e-6) | {(32, 8): 1e-6}
    off = _definition(use_cache=False)
    choice, final = _choose(off, FakeRunner(off.spec, times), monkeypatch)
    assert (off.spec.block_candidates[choice], final) == ((32, 8), True)
    assert cache.records(autotune.RECORD_KIND) == [] and not (fake_gpu / "autotune").exists()
    assert _choose(off, FakeRunner(off.spec, {}), monkeypatch) == (choice, True)  # kept in memory
    assert autotune.stats.benchmarks == 1
    # A choice on disk (the same build, stored by a kernel that uses the cache) is not read.
    on = _definition()
    _choose(on, FakeRunner(on.spec, dict.fromkeys(CANDIDATES, 2e-6) | {(4, 64): 1e-6}), monkeypatch)
    [record] = cache.records(autotune.RECORD_KIND)
    assert record.data["choice"] == [4, 64]
    again = _definition(use_cache=False)
    assert autotune.stored_choice(again, device_index=0, layout="C", key=(4096, 4)) is None
    choice, _ = _choose(again, FakeRunner(again.spec, times), monkeypatch)
    assert again.spec.block_candidates[choice] == (32, 8)
    assert (autotune.stats.benchmarks, autotune.stats.disk_hits) == (3, 0)
    assert [r.data["choice"] for r in cache.records(autotune.RECORD_KIND)] == [[4, 64]]  # untouched


def test_no_benchmark_while_capturing_disabled_or_compiled(fake_gpu, monkeypatch, caplog):
    d = _definition()
    never = FakeRunner(d.spec, {})
    never.run = lambda index: pytest.fail("benchmarked")
    caplog.set_level(logging.WARNING, logger="pnex_magic.launch.autotune")
    # capture: the first candidate, not kept (a later eager call may tune), said once
    assert _choose(d, never, monkeypatch, capturing=True) == (0, False)
    assert _choose(d, never, monkeypatch, capturing=True) == (0, False)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "not autotuned while a CUDA graph is being captured" in warnings[0]
    assert "first candidate, (16, 16)" in warnings[0] and autotune.stats.fallbacks == 2
    # PNEX_AUTOTUNE=0: the first candidate, kept
    monkeypatch.setenv("PNEX_AUTOTUNE", "0")
    assert _choose(d, never, monkeypatch, key=(2, 2)) == (0, True)
    assert "PNEX_AUTOTUNE=0" in caplog.records[-1].getMessage()
    monkeypatch.delenv("PNEX_AUTOTUNE")
    # a call from torch.compile'd code (here: a frame from Inductor's output folder)
    namespace = {"choose": lambda: _choose(d, never, monkeypatch, key=(4, 4))}
    exec(compile("def call():\n    return choose()\n", "/tmp/torchinductor_me/ab/cab.py", "exec"), namespace)
    assert namespace["call"]() == (0, True)
    assert "torch.compile'd code" in caplog.records[-1].getMessage()
    assert autotune.stats.benchmarks == 0 and not autotune._in_compiled_code()


def test_simulator_runs_the_first_candidate_and_the_report_says_so():
    op = tuned(block_shape, threads_per_block=[(4, 2), (8, 8)])
    out = op(torch.zeros(3, 5))
    assert torch.equal(out, torch.full((3, 5), 402, dtype=torch.int32))
    report = pnex.build_report(op, args=(torch.zeros(3, 5),), sass=False)
    assert report.block == (4, 2, 1) and report.grid == (2, 2, 1)
    assert report.autotune.choice == 0 and "CUDA simulator does not autotune" in report.autotune.source
    assert report.candidates == ((4, 2), (8, 8))
    text = str(report)
    assert "autotuned over 2 candidates, first (4, 2)" in text and "autotune  : (4, 2)" in text
    html = autotune_html(report)
    assert "▶ (4, 2)" in html and "(8, 8)" in html and "not autotune" in html
    static = pnex.inspect(op)
    assert static.autotune is None and "give --args" in autotune_html(static)


def test_driver_launcher_tunes_on_copies_and_leaves_the_arguments_alone(fake_gpu, monkeypatch):
    """The Python GPU launcher's tuner path, with the simulator standing in for the GPU."""
    from pnex_magic.launch.driver import DriverLauncher
    from pnex_magic.launch.simulator import SimulatorLauncher

    def bump(x: pnex.InMut("f32", (None,)), total: pnex.Out("f32", (1,), init=0)):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 1.0
            cuda.atomic.add(total, 0, 1.0)

    op = pnex.jit(n_threads="x.numel()", threads_per_block=[4, 8, 16])(bump)
    launcher = DriverLauncher()
    monkeypatch.setattr(launcher, "launch", SimulatorLauncher().launch)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    clock = iter([3e-6, 1e-6, 2e-6])
    monkeypatch.setattr(autotune, "_device_seconds", lambda call, device: (call(), next(clock))[1])
    x = torch.arange(10, dtype=torch.float32)
    total = torch.zeros(1)
    index = launcher.candidate(op.definition, [x, total], torch.device("cpu", 0))
    assert op.spec.launch_candidates[index] == ((8,), 0) and autotune.stats.benchmarks == 1
    assert torch.equal(x, torch.arange(10, dtype=torch.float32)) and total.item() == 0  # untouched
    result = autotune._RESULTS[op.definition][(0, "C", (16,))]
    assert [c.seconds for c in result.candidates] == [3e-6, 1e-6, 2e-6]
    assert launcher.candidate(op.definition, [x, total], torch.device("cpu", 0)) == index  # remembered


def test_saved_artifacts_keep_the_candidates_and_the_key(tmp_path):
    op = tuned(threads_per_block=[(16, 16), (4, 64)], autotune_key=("a.size(0)", "s"))
    loaded = pnex.load(pnex.save(op, tmp_path / "tuned.pnex", archs=("sm_80",)))
    assert loaded.spec.candidates == ((16, 16), (4, 64))
    assert [str(e) for e in loaded.spec.autotune_key] == ["a.size(0)", "s"]
    assert describe_launch(loaded.spec) == describe_launch(op.spec)
