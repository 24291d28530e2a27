"""``jit(tune_requires=...)`` rules that name the call's arguments: each call launches only
the ``Tune`` combinations its sizes keep, without a GPU.

A tile that must divide the matrix (``"w.size(0) % BN == 0"``) holds for some calls and
not others, so such a rule cannot drop a combination at definition: it chooses per call.
Here random rules and calls are checked against a brute-force filter through the CUDA
simulator, the tuner times only the combinations a call keeps (and two calls of one
power-of-two bucket that keep others get keys of their own), a call that keeps none is
refused with the rule and its values, the C++ launcher's evaluator words it alike, and an
artifact, the magic and a derived backward keep the rules.  On a GPU:
``tests/test_gpu_tune.py``.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import ArgumentValueError, ShapeExpressionError, Tune, cache
from pnex_magic.conditions import programs, requirement_message, reworded
from pnex_magic.define import definition as make_definition
from pnex_magic.launch import autotune
from pnex_magic.launch.description import describe_launch
from tune_helpers import FakeClock, cpp_check_rules, fake_gpu


def marked(x: pnex.In("f32", (None,)), s: int, y: pnex.Out("f32", "x"), A: Tune(1, 2, 4, 8), B: Tune(1, 3)):
    """``y = x + 10 A + B``: the output names the combination that ran."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] + A * 10 + B + s * 0


PER_CALL = [  # (the rule, the same in Python over n = x.size(0), s, a, b)
    ("x.size(0) % A == 0", lambda n, s, a, b: n % a == 0),
    ("A * B <= x.size(0)", lambda n, s, a, b: a * b <= n),
    ("x.size(0) >= 4 * B or A == 1", lambda n, s, a, b: n >= 4 * b or a == 1),
    ("(x.size(0) + s) % (A * B) == 0", lambda n, s, a, b: (n + s) % (a * b) == 0),
    ("s * A < 20 and not (B == 3 and s > 2)", lambda n, s, a, b: s * a < 20 and not (b == 3 and s > 2)),
]
STATIC = [("A != B", lambda a, b: a != b), ("A * B <= 12", lambda a, b: a * b <= 12)]


def test_each_call_runs_the_first_combination_its_sizes_keep(poisoned):
    """Random rules (one or two per call, sometimes one over Tune alone) and random calls
    against a brute-force filter of the product: the output names the combination that
    ran, the first kept for the call; a call that keeps none is refused, its output
    untouched (nothing ran)."""
    rng = random.Random(5)
    ran = refused = 0
    for _ in range(6):
        per_call = rng.sample(PER_CALL, rng.choice((1, 2)))
        static = rng.sample(STATIC, rng.choice((0, 1)))
        op = pnex.jit(n_threads="x.numel()", tune_requires=[t for t, _ in per_call + static])(marked)
        kept = [(a, b) for a, b in itertools.product((1, 2, 4, 8), (1, 3)) if all(f(a, b) for _, f in static)]
        assert op.spec.tune_variants == tuple(kept)
        assert [r.text for r in op.spec.call_tune_rules] == [t for t, _ in per_call]
        for _ in range(5):
            n, s = rng.randint(1, 40), rng.randint(0, 5)
            x = torch.randint(-50, 50, (n,)).float()  # whole numbers: x + 10 A + B is exact in any order
            keeps = [(a, b) for a, b in kept if all(f(n, s, a, b) for _, f in per_call)]
            if not keeps:
                with pytest.raises(ArgumentValueError, match=r"^marked\(\): the call breaks tune_requires `.*no "
                                                             r"combination of the Tune choices \(A=.*keeps it"):
                    op(x, s)
                refused += 1
                continue
            a, b = keeps[0]
            torch.testing.assert_close(op(x, s), x + 10 * a + b, rtol=0, atol=0, msg=lambda m: f"{per_call} {n} {s}")
            ran += 1
    assert ran > 10 and refused  # (both outcomes met)


def test_the_refusal_names_the_rule_the_values_and_the_combinations():
    op = pnex.jit(n_threads="x.numel()", tune_requires={"x.size(0) % (2 * A * B) == 0": "the tile divides x",
                                                        "A * B <= 8": ""})(marked)
    with pytest.raises(ArgumentValueError) as caught:
        op(torch.randn(7), 0)
    assert str(caught.value) == (
        "marked(): the call breaks tune_requires `x.size(0) % (2 * A * B) == 0` (x.size(0) = 7): the tile divides x; no "
        "combination of the Tune choices (A=1, B=1; A=1, B=3; A=2, B=1; A=2, B=3; A=4, B=1; A=8, B=1) keeps it for this call")
    assert op(torch.zeros(6), 1).tolist() == [11.0] * 6  # 6 % 2 == 0: A=1, B=1, the first
    assert ("Tune (A: 1, 2, 4, 8; B: 1, 3), 6 of 8 combinations kept by tune_requires, per call: x.size(0) % (2 * "
            "A * B) == 0") in str(pnex.inspect(op))


def test_the_key_holds_which_combinations_the_call_keeps():
    """Calls of one power-of-two bucket (96 and 128) that keep other combinations get
    other keys: a choice timed for one is never launched for the other."""
    d = make_definition(marked, n_threads="x.numel()", tune_requires="x.size(0) % (32 * A) == 0")
    spec = d.spec
    keys = {n: autotune.key_values(spec, {"x": torch.empty(n, device="meta"), "s": 0}) for n in (96, 128, 100)}
    assert keys[96] == (128, 1, 1, 0, 0, 0, 0, 0, 0) and keys[128] == (128, 1, 1, 1, 1, 1, 1, 0, 0)
    assert spec.eligible(keys[96]) == (True, True, False, False, False, False, False, False)
    assert [spec.launch_candidates[spec.first_candidate(keys[n])][1] for n in (96, 128)] == [0, 0]
    assert autotune.key_text(spec, keys[128], "C") == (
        "x.size(0)=128 (sizes rounded up to powers of two), contiguous inputs, 6 of 8 Tune combinations kept by "
        "tune_requires")
    launch = describe_launch(spec)
    assert len(launch["key"]) == 1 + 8 and launch["requires"][-1]["text"].startswith("tune_requires: ")


def test_the_tuner_times_only_what_the_call_keeps(monkeypatch, fresh_cache):
    fake_gpu(monkeypatch)
    d = make_definition(marked, n_threads="x.numel()", threads_per_block=[128, 256],
                        tune_requires="x.size(0) % (A * B) == 0")
    spec = d.spec
    times = {(blk, a, b): 1e-6 * (10 - a) for blk in (128, 256) for a, b in spec.tune_variants}
    times[(256, 8, 1)] = 1e-9  # the fastest, but only for sizes that 8 divides
    for n, want in [(96, (256, 8, 1)), (36, (128, 4, 1))]:
        key = autotune.key_values(spec, {"x": torch.empty(n, device="meta"), "s": 0})
        fake = FakeClock(spec, times)
        monkeypatch.setattr(autotune, "_device_seconds", fake.seconds)
        choice, final = autotune.choose(d, device_index=0, layout="C", key=key, capturing=False, runner=fake.runner)
        block, variant = spec.launch_candidates[choice]
        assert (block[0], *spec.tune_variants[variant]) == want and final
        keeps = {(a, b) for a, b in spec.tune_variants if n % (a * b) == 0}
        assert {spec.tune_variants[spec.launch_candidates[i][1]] for i in fake.runs} == keeps  # no other ran
        result = autotune._RESULTS[d][(0, "C", key)]
        for c in result.candidates:
            assert (c.seconds is not None) == ((dict(c.tune)["A"], dict(c.tune)["B"]) in keeps)
            if c.seconds is None:
                assert c.skipped == "its Tune values break tune_requires for this call: `x.size(0) % (A * B) == 0`"
    assert len(cache.records(autotune.RECORD_KIND)) == 2  # 96 and 36 share a bucket (128), not a key


def test_untuned_calls_launch_the_first_combination_they_keep(monkeypatch, fresh_cache):
    """Under CUDA graph capture, with autotuning off, and for a one-off checked run."""
    fake_gpu(monkeypatch)
    d = make_definition(marked, n_threads="x.numel()", tune_requires="x.size(0) % A == 0 and A > 1")
    key = autotune.key_values(d.spec, {"x": torch.empty(12, device="meta"), "s": 0})
    first = d.spec.launch_candidates.index(((256,), d.spec.tune_variants.index((2, 1))))
    assert autotune.choose(d, device_index=0, layout="C", key=key, capturing=True, runner=None) == (first, False)
    monkeypatch.setenv("PNEX_AUTOTUNE", "0")
    assert autotune.choose(d, device_index=0, layout="C", key=key, capturing=False, runner=None) == (first, True)
    assert autotune._RESULTS[d][(0, "C", key)].tune == (("A", 2), ("B", 1))


@pytest.mark.parametrize("rules, pattern", [
    ("x.size(0) % 4 == 0", r"tune_requires\[0\]: 'x.size\(0\) % 4 == 0' names no Tune parameter \(A, B\): a rule on "
                           r"the call's arguments alone goes in requires="),
    ("y.size(0) % A == 0", r"names 'y', an output: its sizes follow from the arguments; state the rule on those"),
    ("z % A == 0", r"names 'z', not a parameter of the kernel; tune_requires rules name Tune parameters \(A, B\), "
                   r"the call's arguments and integer constants"),
])
def test_mistakes_in_rules_per_call_are_named(rules, pattern):
    with pytest.raises(ShapeExpressionError, match=pattern):
        make_definition(marked, n_threads="x.numel()", tune_requires=rules)


def test_rules_too_deep_for_the_cpp_launcher_once_combined_are_refused_at_definition():
    """Each rule alone fits the C++ evaluator's 64-entry stack; the rule that some
    combination keeps them folds one condition a combination and nests two deeper."""
    nested = "A"
    for _ in range(61):
        nested = f"1 + ({nested})"
    make_definition(marked, n_threads="x.numel()", tune_requires=f"x.size(0) % ({nested}) == 0")  # 64 deep: fits
    with pytest.raises(ShapeExpressionError, match=r"kernel 'marked', tune_requires .*: combined over the Tune "
                                                   r"combinations, the rules nest deeper than the C\+\+ launcher"):
        make_definition(marked, n_threads="x.numel()", tune_requires=f"x.size(0) % (1 + ({nested})) == 0")


def test_a_saved_artifact_keeps_the_rules_per_call(tmp_path):
    op = pnex.jit(n_threads="x.numel()", tune_requires={"x.size(0) % A == 0": "A divides x", "B == 1": ""})(marked)
    loaded = pnex.load(pnex.save(op, tmp_path / "marked.pnex", archs=("sm_80",)))
    assert [(r.text, r.why) for r in loaded.spec.call_tune_rules] == [("x.size(0) % A == 0", "A divides x")]
    assert loaded.spec.tune_variants == op.spec.tune_variants == ((1, 1), (2, 1), (4, 1), (8, 1))
    assert loaded.spec.variant_checks == op.spec.variant_checks
    assert describe_launch(loaded.spec) == describe_launch(op.spec)  # the key and the rule the C++ launcher checks


def test_the_magic_report_and_a_derived_backward_keep_them(tmp_path, monkeypatch):
    pytest.importorskip("IPython")
    from IPython.testing import globalipapp

    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))
    ip = globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_cell("import torch")
    ip.run_cell_magic("pnex", '--n-threads x.numel() --tune-requires "x.size(0) % A == 0" --tune-requires "B == 3" '
                              '-o rep', '''
def marked_magic(x: In("f32", (None,)), y: Out("f32", "x"), A: Tune(1, 2, 4, 8), B: Tune(1, 3)):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] + A * 10 + B
''')
    op = ip.user_ns["marked_magic"]
    html = ip.user_ns["rep"].signature_html()
    assert "Tune combinations kept: 4 of 8" in html and "each call launches only the Tune combinations" in html
    assert op(torch.zeros(6)).tolist() == [13.0] * 6  # A=1, B=3
    backward = pnex.derive_backward(pnex.jit(n_threads="x.numel()", tune_requires="x.size(0) % A == 0")(marked))
    assert [r.text for r in backward.spec.call_tune_rules] == ["x.size(0) % A == 0"]


@pytest.mark.slow
def test_the_cpp_launcher_checks_the_rule_and_words_it_alike(built_launcher, stand_in, pnex_env):
    """The rule every launcher checks (some combination keeps the rules per call) through
    the C++ launcher's evaluator (its ``check_rules`` test entry) on random calls: the
    same truth and, reworded as the op does, the same message as the Python launchers."""
    spec = make_definition(marked, n_threads="x.numel()",
                           tune_requires=["(x.size(0) + s) % (2 * A * B) == 0", "A * B <= 8"]).spec
    rules = spec.checked_requires
    order = [p.name for p in spec.params]
    rng = random.Random(3)
    cases, expected = [], []
    for _ in range(60):
        n, s = rng.randint(0, 50), rng.randint(-3, 9)
        env = {"x": torch.empty(n, device="meta"), "s": s}
        cases.append({"rules": programs(rules, order.index), "sizes": [[n], [], [], [], []], "ints": [0, s, 0, 0, 0]})
        holds = [bool(r.condition.evaluate(env)) for r in rules]
        broken = next((requirement_message("marked", i, r, [t.evaluate(env) for t in r.terms])
                       for i, r in enumerate(rules) if not holds[i]), "")
        expected.append((broken, [int(h) for h in holds]))
    got = cpp_check_rules("marked", cases, built_launcher, stand_in, pnex_env)
    assert any(h == [0] for _, h in expected) and any(h == [1] for _, h in expected)
    for (message, values), (want_message, want_values) in zip(got, expected, strict=True):
        assert (reworded(message), values) == (want_message, want_values)


def test_jax_launches_the_first_combination_the_call_keeps():
    pytest.importorskip("jax")
    import numpy as np

    op = pnex.jit(n_threads="x.numel()", tune_requires="x.size(0) % (4 * A) == 0 and A > 1")(marked)
    f = pnex.jax_op(op)
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(f(x, 0)), x + 21)  # A=2, B=1: the first the call keeps
    with pytest.raises(Exception, match=r"marked\(\): the call breaks tune_requires `x.size\(0\) % \(4 \* A\) == 0 and "
                                        r"A > 1` \(x.size\(0\) = 6\)"):
        f(np.arange(6, dtype=np.float32), 0)


def test_torch_compile_runs_the_combination_the_call_keeps_and_refuses_one_that_keeps_none():
    op = pnex.jit(n_threads="x.numel()", tune_requires="x.size(0) % (4 * A) == 0 and A > 1")(marked)
    compiled = torch.compile(lambda x: op(x, 0) * 2, fullgraph=True)
    x = torch.randint(-50, 50, (16,)).float()  # whole numbers: exact in any order
    torch.testing.assert_close(compiled(x), (x + 21) * 2, rtol=0, atol=0)  # A=2, B=1
    with pytest.raises(Exception, match=r"the call breaks tune_requires `x.size\(0\) % \(4 \* A\) == 0 and A > 1` "
                                        r"\(x.size\(0\) = 12\)"):
        compiled(torch.randn(12))
