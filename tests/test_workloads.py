"""benchmarks/workloads.py: its kernels against plain PyTorch, and its command line at
smoke size (on CPU through the CUDA simulator; the real run needs a GPU)."""

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import run_notebooks  # noqa: E402
import workloads as wl  # noqa: E402


@pytest.mark.parametrize("shape", [(19, 37), (40, 33), (3, 2)])
def test_diffusion_kernel_matches_float64_on_ragged_tiles(shape):
    # Sides that are not multiples of the 32 x 32 tile: edge blocks are partial.
    g = torch.Generator()
    g.seed()
    u0 = torch.rand(*shape, generator=g)
    got = wl.run_diffusion(wl.diffusion_step, u0, 3, 0.25)
    torch.testing.assert_close(got.double(), wl.reference_diffusion(u0, 3, 0.25), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(wl.run_diffusion_eager(u0, 3, 0.25).double(), wl.reference_diffusion(u0, 3, 0.25),
                               rtol=1e-5, atol=1e-6)


def test_diffusion_odd_step_count_and_eager_into():
    u0 = wl.initial_field(16)
    torch.testing.assert_close(wl.run_diffusion(wl.diffusion_step, u0, 1, 0.25).double(),
                               wl.reference_diffusion(u0, 1, 0.25), rtol=1e-5, atol=1e-6)
    out = torch.empty_like(u0)
    wl.eager_step_into(u0, out, 0.25)
    torch.testing.assert_close(out.double(), wl.reference_diffusion(u0, 1, 0.25), rtol=1e-5, atol=1e-6)


def _random_field(*shape):
    g = torch.Generator()
    g.seed()
    return torch.rand(*shape, generator=g) - 0.25  # nonzero at the edges, signs mixed


@pytest.mark.parametrize("steps", [1, 3, 4])
def test_blocked_diffusion_one_launch_matches_float64(steps):
    # 64 x 48 with the first choice's 32 x 32 tile: blocks update (32 - 2 steps)-point squares,
    # none of which divides the field; every point must be written (the output is poisoned).
    u0 = _random_field(64, 48)
    out = torch.full_like(u0, float("nan"))
    wl.diffusion_blocked(u0, out, 0.25, steps)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), wl.reference_diffusion(u0, steps, 0.25), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("steps, per_launch", [(7, 3), (5, 5), (2, 4)])
def test_blocked_diffusion_runs_with_a_remainder(steps, per_launch):
    # steps not a multiple of per_launch: the last launch takes the remainder (2 < 4: one launch)
    u0 = _random_field(37, 19)
    got = wl.run_diffusion_blocked(wl.diffusion_blocked, u0, steps, 0.25, per_launch)
    torch.testing.assert_close(got.double(), wl.reference_diffusion(u0, steps, 0.25), rtol=1e-5, atol=1e-6)
    assert torch.equal(wl.run_diffusion_blocked(wl.diffusion_blocked, u0, 0, 0.25, per_launch), u0)


def test_blocked_diffusion_every_tile_shape_is_exact(monkeypatch):
    # The simulator runs the first Tune choice; here each launch candidate in turn (the
    # autotuner's choices on a GPU), on a field no tile shape divides, poisoned output.
    from pnex_magic.launch.simulator import SimulatorLauncher

    spec = wl.diffusion_blocked.definition.spec
    assert [v for _, v in spec.launch_candidates] == list(range(6))
    u0 = _random_field(70, 45)
    expected = wl.reference_diffusion(u0, 3, 0.25)
    for candidate, (_, variant) in enumerate(spec.launch_candidates):
        monkeypatch.setattr(SimulatorLauncher, "candidate", lambda self, d, v, device, c=candidate: c)
        out = torch.full_like(u0, float("nan"))
        wl.diffusion_blocked(u0, out, 0.25, 3)
        assert not out.isnan().any(), spec.tune_values(variant)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6, msg=str(spec.tune_values(variant)))


@pytest.mark.parametrize("per_launch", [0, wl.MAX_STEPS_PER_LAUNCH + 1])
def test_blocked_diffusion_refuses_a_halo_wider_than_the_tile(per_launch):
    with pytest.raises(ValueError, match=f"per_launch must be from 1 to {wl.MAX_STEPS_PER_LAUNCH}.*got {per_launch}"):
        wl.run_diffusion_blocked(wl.diffusion_blocked, torch.zeros(4, 4), 8, 0.25, per_launch)


@pytest.mark.parametrize("steps", [-1, wl.MAX_STEPS_PER_LAUNCH + 1])
def test_the_blocked_kernel_itself_refuses_steps_its_tiles_cannot_hold(steps):
    """Called directly (not through run_diffusion_blocked), steps outside 0..15 computed
    wrong values without a fault; its jit(requires=...) refuses them, the output untouched."""
    import pnex_magic as pnex

    u0, out = _random_field(40, 40), torch.full((40, 40), float("nan"))
    with pytest.raises(pnex.ArgumentValueError, match=rf"requires\[0\] `0 <= steps <= 15` \(steps = {steps}\)"):
        wl.diffusion_blocked(u0, out, 0.25, steps)
    assert out.isnan().all()


@pytest.mark.parametrize("n", [1, 150, 1025])  # 1024 points per block of 256 threads
@pytest.mark.parametrize("labels_dtype", [torch.int64, torch.int32])
def test_kmeans_kernel_matches_reference(n, labels_dtype):
    X, means = wl.kmeans_data(n, "cpu", seed=torch.seed() % 2**31)
    means = torch.cat([means, torch.tensor([[7.5, 7.5]])])
    labels = wl.kmeans_ops(labels_dtype)(X, means)
    assert labels.dtype == labels_dtype
    ok, text = wl.check_labels(labels, wl.kmeans_reference(X, means), X, means)
    assert ok, text


def test_kmeans_first_of_equal_distances_and_no_centroids():
    X = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    means = torch.tensor([[1.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    assert wl.kmeans_assign(X, means).tolist() == wl.kmeans_reference(X, means).tolist() == [0, 0]
    assert wl.kmeans_assign(X, torch.empty(0, 2)).tolist() == [-1, -1]


def _autotune_kmeans(points_per_thread: int, tmp_path: Path):
    """The benchmarks' pnex.Tune k-means kernels (``workloads.kmeans_tuned_ops``, which
    benchmarks/autotune.py times too) with ``POINTS`` fixed to one of its choices (the
    simulator runs the first choice only) and 32-thread blocks."""
    import importlib
    import inspect
    import textwrap

    body = textwrap.dedent(inspect.getsource(wl.kmeans_tuned_ops))
    assert "POINTS: pnex.Tune(1, 2, 4, 8, 16)" in body and 'threads_per_block="auto"' in body
    body = body.replace("POINTS: pnex.Tune(1, 2, 4, 8, 16)", f"POINTS: pnex.Tune({points_per_thread})")
    body = body.replace('threads_per_block="auto"', "threads_per_block=32")
    name = f"autotune_kmeans_{points_per_thread}"
    (tmp_path / f"{name}.py").write_text(
        "import math\nfrom typing import Any\nimport torch\nimport pnex_magic as pnex\n"
        "from numba import cuda, float32, int32\n_kmeans_cache = {}\n"
        "def named_in_workloads(fn):\n    return fn\n"  # named after this module: ops of their own
        + body + "i32 = kmeans_tuned_ops(torch.int32)\ni64 = kmeans_tuned_ops(torch.int64)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("points_per_thread", [1, 2, 4, 8, 16])
def test_autotune_kmeans_kernel_every_choice_matches_eager(points_per_thread, tmp_path):
    # Every POINTS choice of the benchmark's tuned kernel, at sizes around a block's points
    # (ragged last blocks and threads), three centroids: the labels are eager's, exactly.
    kernels = _autotune_kmeans(points_per_thread, tmp_path)
    block = 32 * points_per_thread
    for n in (1, block - 1, block + 1, 3 * block + 17):
        X, means = wl.kmeans_data(n, "cpu", seed=n)
        means = torch.cat([means, torch.tensor([[7.5, 7.5]])])
        expected = wl.kmeans_reference(X, means)
        for op, dtype in ((kernels.i32, torch.int32), (kernels.i64, torch.int64)):
            labels = op(X, means)
            assert labels.dtype == dtype and torch.equal(labels, expected.to(dtype)), (n, op)
    X = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    assert kernels.i32(X, torch.tensor([[1.0, 0.0], [1.0, 0.0]])).tolist() == [0, 0]  # ties: the first
    assert kernels.i64(X, torch.empty(0, 2)).tolist() == [-1, -1]
    assert torch.equal(kernels.i32(X.t().contiguous().t(), X), torch.tensor([0, 1], dtype=torch.int32))


def test_the_facade_exports_every_part_and_the_ops_keep_their_names():
    """workloads.py re-exports workloads_lib: every public name of its modules is in
    ``wl.__all__`` and is the same object, and the kernels' ops are named after the
    ``workloads`` module, as when they were written there (an op's name hashes module.qualname)."""
    import importlib
    import pkgutil

    import workloads_lib

    parts = [importlib.import_module(f"workloads_lib.{m.name}") for m in pkgutil.iter_modules(workloads_lib.__path__)]
    assert {m.__name__.split(".")[1] for m in parts} >= {"timing", "results", "rounds", "provenance",
                                                         "diffusion_kernels", "diffusion_bench", "lltm", "kmeans"}
    exported = set(wl.__all__)
    assert len(exported) == len(wl.__all__)
    for module in parts:
        for name in getattr(module, "__all__", ()):
            if name in ("ROUNDS", "WORKLOADS_MODULE", "named_in_workloads"):  # settings and the naming helper
                continue
            assert name in exported, f"{module.__name__}.{name} is not in workloads.__all__"
            assert getattr(wl, name) is getattr(module, name), name
    assert all(hasattr(wl, name) for name in wl.__all__)
    ops = [wl.diffusion_step, wl.diffusion_blocked, wl.lltm_forward, wl.lltm_backward, wl.kmeans_assign,
           *wl.lltm_ops(torch.float64), wl.kmeans_ops(torch.int32), wl.kmeans_tuned_ops(torch.int32)]
    assert {op.definition.spec.module for op in ops} == {"workloads"}
    # ... and so is the copy each compile and the cache key are made of (pnex_magic.snapshot)
    assert {op.definition.snapshot.function.__module__ for op in ops} == {"workloads"}
    assert wl.diffusion_step.definition.op_name == "diffusion_step_7c65175a"  # sha256("workloads.diffusion_step")
    assert wl.kmeans_ops(torch.int64) is wl.kmeans_assign and wl.lltm_ops(torch.float32).forward is wl.lltm_forward


def test_the_rounds_setting_is_read_and_written_through_the_facade(monkeypatch):
    # ROUNDS and _TRACEBACKS live in workloads_lib.rounds, where _run_rounds reads them; the
    # facade's wl.ROUNDS / wl._TRACEBACKS read and write them there (overhead.py sets the latter).
    from workloads_lib import rounds

    before = (rounds.ROUNDS, rounds._TRACEBACKS)
    with monkeypatch.context() as m:
        m.setattr(wl, "ROUNDS", 1)
        m.setattr(wl, "_TRACEBACKS", not before[1])
        assert (rounds.ROUNDS, wl.ROUNDS, rounds._TRACEBACKS) == (1, 1, not before[1])
        calls = []
        wl._run_rounds([], [("a", lambda: calls.append("a") or 1.0)])
        assert calls == ["a"]  # one round
    assert (rounds.ROUNDS, rounds._TRACEBACKS) == before and "ROUNDS" not in vars(wl)


def test_check_labels_rejects_a_wrong_label():
    X, means = wl.kmeans_data(10, "cpu")
    expected = wl.kmeans_reference(X, means)
    wrong = expected.clone()
    wrong[0] = 1 - wrong[0]
    ok, text = wl.check_labels(wrong, expected, X, means)
    assert not ok and "1 of 10 labels differ" in text


def test_table_formats():
    w = wl.Workload("k-means", "10 points", "per call", [
        wl.Row(wl.EAGER, 2e-3), wl.Row(wl.COMPILED, 1e-4), wl.Row("pnex kernel", 8e-5, check="matches"),
        wl.Row(wl.FLOOR, 7.6e-5), wl.Row("broken", None, note="FAILED: x"),
    ], headline="pnex kernel", goal="within 1.3x of the floor", goal_met=True)
    text = wl.format_table([w])
    # Every ratio is a speed (another time over this one): eager's 25.00x, torch.compile's 1.25x, and
    # the floor's 0.95x (the kernel takes 1.05x the floor's time); the header says which is which.
    assert "25.00x" in text and "1.25x" in text and "0.95x" in text and "MET: within 1.3x" in text
    assert wl.TIME_COLUMN in text and all(column in text for column in wl.SPEED_COLUMNS)
    assert "broken [FAILED: x]" in text
    assert wl.markdown_table([w]).count("\n") == 6
    assert json.dumps(w.to_json())


def test_a_missed_goal_says_why_from_the_times():
    """04_kmeans on an H200: int64 labels tie with torch.compile at the floor; int32 labels lose to it."""
    tie = wl._kmeans_why(79.0e-6, 80.1e-6, 79.0e-6)
    assert tie == ("a tie with torch.compile (79.0 µs against 79.0 µs): both run at the memory floor's speed "
                   "(1.01x and 1.01x): a kernel moving these bytes cannot get much faster than a copy of them")
    assert wl._kmeans_why(73.6e-6, 61.4e-6, 60.0e-6) == (
        "torch.compile is faster: 60.0 µs against 73.6 µs (1.02x the floor's speed against the pnex kernel's 0.83x)")
    assert wl._kmeans_why(90e-6, 61.4e-6, 95e-6).startswith("the pnex kernel takes 1.47x the floor's time")
    w = wl.Workload("LLTM", "batch 16", "forward+backward", [
        wl.Row("pnex fused kernels (eager)", 5e-4, rounds=[5.1e-4, 5e-4, 5.2e-4]),
        wl.Row(wl.EAGER, 7.6e-4, rounds=[7.6e-4, 4.9e-4, 7.7e-4]),
    ], headline="pnex fused kernels (eager)", goal="faster than eager in every round", goal_met=False)
    w.goal_why = wl._rounds_lost(w, ["pnex fused kernels (eager)"], [wl.EAGER])
    assert w.goal_why == "lost round 2: eager PyTorch 490.0 µs against 500.0 µs"
    assert wl.goal_line(w) == ("LLTM batch 16: goal NOT MET: faster than eager in every round; lost round 2: "
                               "eager PyTorch 490.0 µs against 500.0 µs")


def test_comparisons_in_words():
    w = wl.Workload("LLTM", "batch 16", "forward+backward", [
        wl.Row(wl.COMPILED, 765.4e-6), wl.Row(wl.COMPILED_GRAPHS, 774.0e-6, host_seconds=700e-6),
        wl.Row("pnex fused kernels (eager)", 513.8e-6, host_seconds=100e-6),
        wl.Row("pnex fused kernels in torch.compile", 960.7e-6),
    ])
    assert wl.versus(w, wl.COMPILED_GRAPHS, wl.COMPILED) == (
        "torch.compile(mode='reduce-overhead'): 774.0 µs against torch.compile: 765.4 µs; a tie")
    assert wl.versus(w, "pnex fused kernels in torch.compile", "pnex fused kernels (eager)").endswith(
        "960.7 µs against pnex fused kernels (eager): 513.8 µs; 0.53x its speed: slower")
    assert wl.host_share(w.rows[1]).endswith("the host sets the pace (host-bound)")
    assert wl.host_share(w.rows[2]).endswith("the GPU sets the pace")
    assert wl.host_share(w.rows[0]) == "torch.compile: host time not measured"


@pytest.mark.slow
def test_smoke_run(tmp_path, capsys):
    out = tmp_path / "smoke.json"
    assert wl.main(["--smoke", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "FAILED" not in printed and "DIFFERS" not in printed
    result = json.loads(out.read_text())
    assert result["smoke"] is True
    assert [w["name"] for w in result["workloads"]] == [
        "diffusion", "LLTM", "k-means (int64 labels)", "k-means (int32 labels)"
    ]
    for w in result["workloads"]:
        assert all(r["seconds"] is not None for r in w["rows"]), w


def test_full_run_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("there is a GPU here")
    assert wl.main([]) == 1
    assert "needs an NVIDIA GPU" in capsys.readouterr().out
    assert run_notebooks.main([]) == 1


def test_variants_run_in_interleaved_rounds_and_keep_the_minimum_of_their_medians():
    calls = []
    times = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 6.0])}

    def timed(name):
        def run():
            calls.append(name)
            return next(times[name])
        return run

    def broken():
        calls.append("broken")
        raise RuntimeError("no GPU")

    rows = []
    wl._run_rounds(rows, [("a", timed("a")), ("b", timed("b")), ("broken", broken)], rounds=3)
    assert calls == ["a", "b", "broken", "b", "a", "a", "b"]  # each round starts one further on; broken runs once
    by = {r.variant: r for r in rows}
    assert [r.variant for r in rows] == ["a", "b", "broken"]
    assert (by["a"].seconds, by["a"].rounds) == (1.0, [3.0, 1.0, 2.0])
    assert (by["b"].seconds, by["b"].rounds) == (4.0, [5.0, 4.0, 6.0])
    assert by["broken"].seconds is None and by["broken"].note.startswith("FAILED: RuntimeError: no GPU")
    w = wl.Workload("w", "s", "per call", rows)
    assert wl._each_round(w, ["a"], ["b"]) == [True, True, True]
    assert wl._each_round(w, ["b"], ["a"]) == [False, False, False]
    assert wl._each_round(w, ["a"], ["broken"]) == [None, None, None]


def _diffusion(**us):
    names = {"eager": wl.EAGER, "raw": wl.RAW, "floor": wl.FLOOR, "one": "pnex op, Python loop",
             "blocked": wl.blocked_variant(4), "graph": wl.blocked_variant(4, 80)}
    return wl.Workload("diffusion", "2000x2000", "per step", [wl.Row(names[k], v * 1e-6) for k, v in us.items()])


def test_diffusion_goal_is_judged_on_the_fastest_pnex_variant():
    w = _diffusion(eager=130.0, raw=30.0, floor=10.4, one=16.8, blocked=6.0, graph=5.5)
    wl.judge_diffusion(w)
    assert w.headline == wl.blocked_variant(4, 80) and w.goal_met is True and w.goal_why == ""
    assert "<= 1.3x the memory floor's time (one step's read + write of the field)" in w.goal
    # the one-step kernel alone: 1.62x the floor, goal missed, with the reason in figures
    w = _diffusion(eager=130.0, raw=30.0, floor=10.4, one=16.8)
    wl.judge_diffusion(w)
    assert w.goal_met is False
    assert w.goal_why == "pnex op, Python loop takes 1.62x the memory floor's time (16.8 µs against 10.4 µs)"
    w = _diffusion(eager=30.0, raw=5.0, floor=10.4, blocked=6.0)
    wl.judge_diffusion(w)
    assert w.goal_why == (f"{wl.blocked_variant(4)} takes 6.0 µs, the raw loop 5.0 µs; "
                          f"{wl.blocked_variant(4)} is 5.00x eager's speed")
    w = _diffusion(eager=130.0, raw=30.0, blocked=6.0)  # no floor timed: not judged
    wl.judge_diffusion(w)
    assert w.goal_met is None


def test_blocked_graph_steps_keep_the_result_in_the_first_buffer():
    assert wl._blocked_graph_steps(2000, 4) == 80 and wl._blocked_graph_steps(2000, 8) == 80
    assert wl._blocked_graph_steps(2000, 5) == 100 and wl._blocked_graph_steps(2000, 1) == 100
    assert wl._blocked_graph_steps(6, 4) == 0
    for chunk, t in [(2000, 4), (2000, 8), (1000, 3), (96, 6)]:
        g = wl._blocked_graph_steps(chunk, t)
        assert g == 0 or (chunk % g == 0 and g % (2 * t) == 0 and g <= 100)


@pytest.mark.gpu
@pytest.mark.parametrize("per_launch", [1, 4, 8])
def test_blocked_diffusion_on_the_gpu_every_tile_runs_and_agrees(per_launch, gpu_cache):
    # On a GPU the first call of each key times every tile; a tile whose result differed from the
    # first's (or that failed) would be skipped: here none may be.  Then the tuned op against float64
    # on a field no tile divides, with a remainder launch, and one poisoned launch.
    from pnex_magic.launch import autotune

    u0 = _random_field(301, 257).cuda()
    out = torch.full_like(u0, float("nan"))
    wl.diffusion_blocked(u0, out, 0.25, per_launch)
    result = autotune.result_for(wl.diffusion_blocked.definition, (u0, out, 0.25, per_launch))
    assert result is not None and result.source == "benchmarked", result
    assert [c.skipped for c in result.candidates] == [""] * 6
    assert all(c.seconds for c in result.candidates), [c.label() for c in result.candidates if not c.seconds]
    assert not out.isnan().any()
    torch.testing.assert_close(out.double().cpu(), wl.reference_diffusion(u0.cpu(), per_launch, 0.25),
                               rtol=1e-5, atol=1e-6)
    steps = 3 * per_launch + 1
    got = wl.run_diffusion_blocked(wl.diffusion_blocked, u0, steps, 0.25, per_launch)
    torch.testing.assert_close(got.double().cpu(), wl.reference_diffusion(u0.cpu(), steps, 0.25), rtol=1e-5, atol=1e-6)
