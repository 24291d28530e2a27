"""``jit(tune_requires=...)``: rules over ``Tune`` parameters alone keep the combinations of
their choices that hold, without a GPU (rules that also name the call's arguments:
``tests/test_tune_requires_per_call.py``).

``Tune`` alone compiles every combination of its parameters' choices, and a choice can
only be dropped from all of them: a tile shape whose buffers do not fit in shared memory
with 5 pipeline stages but do with 3 could not be kept with 3.  Here the variants are
checked against a brute-force filter on random rules, the tuner times only those kept, the
shared-memory check skips those dropped, mistakes are named, and an artifact, the magic and
a derived backward keep the same variants.  On a GPU: ``tests/test_gpu_tune.py``.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelDefinitionError, ShapeExpressionError, Tune, cache
from pnex_magic.define import definition as make_definition
from pnex_magic.launch import autotune
from pnex_magic.launch.description import describe_launch
from tune_helpers import FakeClock, fake_gpu


def scaled(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x"), A: Tune(1, 2, 4), B: Tune(1, 2, 4)):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * A + B


RULES = [  # (the rule, the same in Python over a and b)
    ("A * B <= {t}", lambda a, b, t: a * b <= t),
    ("A % B == 0 or A < {t}", lambda a, b, t: a % b == 0 or a < t),
    ("not (A == {t})", lambda a, b, t: not a == t),
    ("min(A, B) * 2 >= {t} and A != B", lambda a, b, t: min(a, b) * 2 >= t and a != b),
    ("max(A - B, B - A) < {t}", lambda a, b, t: max(a - b, b - a) < t),
    ("A + 2 * B > {t}", lambda a, b, t: a + 2 * b > t),
]


def test_the_variants_are_the_combinations_that_keep_every_rule_in_order():
    """Random choices and random rules (one or two) against a brute-force filter of the
    product, in the product's order; a rule set that keeps nothing is refused."""
    rng = random.Random(11)
    refused = kept_some = 0
    for _ in range(60):
        a_choices = tuple(rng.sample(range(1, 13), 3))
        b_choices = tuple(rng.sample(range(1, 13), rng.choice((2, 3))))
        rules = rng.sample(RULES, rng.choice((1, 2)))
        thresholds = [rng.randint(1, 40) for _ in rules]
        texts = [text.format(t=t) for (text, _), t in zip(rules, thresholds)]
        want = tuple((a, b) for a, b in itertools.product(a_choices, b_choices)
                     if all(check(a, b, t) for (_, check), t in zip(rules, thresholds)))

        def make():
            return make_definition(scaled, n_threads="x.numel()", tune={"A": a_choices, "B": b_choices},
                                   tune_requires=texts)

        if not want:
            with pytest.raises(ShapeExpressionError, match="no combination of the Tune choices keeps tune_requires"):
                make()
            refused += 1
            continue
        spec = make().spec
        assert spec.tune_variants == want, texts
        assert [v for _, v in spec.launch_candidates] == list(range(len(want)))
        assert spec.tune_values(0) == dict(zip("AB", want[0]))  # the default: the first combination kept
        kept_some += 1
    assert refused and kept_some > 40  # (both outcomes met)


def test_the_tuner_times_only_the_kept_combinations(monkeypatch, fresh_cache):
    fake_gpu(monkeypatch)
    d = make_definition(scaled, n_threads="x.numel()", threads_per_block=[128, 256], tune_requires="A * B <= 4")
    kept = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1))
    assert d.spec.tune_variants == kept
    launch = describe_launch(d.spec)
    assert launch["variants"] == [list(v) for v in kept] and len(launch["candidates"]) == 2 * len(kept)
    times = {(b, a, c): 1e-6 * (a + c) for b in (128, 256) for a, c in kept}
    times[(128, 4, 1)] = 1e-7  # the fastest kept
    fake = FakeClock(d.spec, times)  # (a dropped combination would be a KeyError here)
    monkeypatch.setattr(autotune, "_device_seconds", fake.seconds)
    choice, final = autotune.choose(d, device_index=0, layout="C", key=(4096,), capturing=False, runner=fake.runner)
    assert d.spec.launch_candidates[choice] == ((128,), kept.index((4, 1))) and final
    result = autotune._RESULTS[d][(0, "C", (4096,))]
    assert result.tune == (("A", 4), ("B", 1))
    assert len([c for c in result.candidates if c.seconds is not None]) == 2 * len(kept)
    [record] = cache.records(autotune.RECORD_KIND)
    assert record.data["choice_tune"] == [4, 1]


def test_the_simulator_runs_the_first_kept_combination(poisoned):
    op = pnex.jit(n_threads="x.numel()", tune_requires={"A > 1 and B > A": "wider than tall"})(scaled)
    assert op.spec.tune_variants == ((2, 4),)
    x = torch.randn(77)
    torch.testing.assert_close(op(x), x * 2 + 4, rtol=0, atol=0)


def test_a_dropped_combination_is_not_checked_for_shared_memory():
    def staged(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x"), STAGES: Tune(2, 3), TILE: Tune(64, 128)):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = x[i]

    dropped = r"STAGES=2, TILE=128 gives 262,144 bytes .*\(tune_requires= removes a combination"
    with pytest.raises(KernelDefinitionError, match=dropped):
        make_definition(staged, n_threads="x.numel()", shared_bytes="STAGES * TILE * 1024")
    d = make_definition(staged, n_threads="x.numel()", shared_bytes="STAGES * TILE * 1024",
                        tune_requires="STAGES * TILE * 1024 <= 232448")
    assert d.spec.tune_variants == ((2, 64), (3, 64))
    assert d.spec.shared_per_variant == (131072, 196608)


@pytest.mark.parametrize("rules, pattern", [
    ("x.size(0) <= 4", r"tune_requires\[0\]: 'x.size\(0\) <= 4' names no Tune parameter \(A, B\): a rule on the "
                       r"call's arguments alone goes in requires="),
    (["A < 9", "C < 2"], r"tune_requires\[1\]: 'C < 2' names 'C', not a parameter of the kernel; tune_requires "
                         r"rules name Tune parameters \(A, B\)"),
    ("A // (B - B) == 1", r"tune_requires\[0\]: `A // \(B - B\) == 1` with the Tune choice A=1, B=1: division by zero"),
    ("A * B > 100", r"no combination of the Tune choices keeps tune_requires \(`A \* B > 100`\)"),
    ("A * B", r"'A \* B' is not a condition"),
    (5, r"tune_requires= takes a condition string, a list of them, or a dict"),
])
def test_mistakes_in_the_rules_are_named(rules, pattern):
    with pytest.raises(ShapeExpressionError, match=pattern):
        make_definition(scaled, n_threads="x.numel()", tune_requires=rules)


def test_rules_need_tune_parameters_and_requires_points_to_tune_requires():
    def plain(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x")):
        pass

    with pytest.raises(ShapeExpressionError, match="tune_requires= needs Tune parameters; the kernel has none"):
        make_definition(plain, n_threads="x.numel()", tune_requires="1 < 2")
    with pytest.raises(ShapeExpressionError, match=r"names 'A', a Tune parameter: .* goes in tune_requires="):
        make_definition(scaled, n_threads="x.numel()", requires="A < 3")


def test_a_saved_artifact_keeps_the_rules_and_the_variants(tmp_path):
    op = pnex.jit(n_threads="x.numel()", tune_requires={"A * B <= 2": "small"})(scaled)
    spec = op.spec
    assert spec.tune_variants == ((1, 1), (1, 2), (2, 1))
    loaded = pnex.load(pnex.save(op, tmp_path / "scaled.pnex", archs=("sm_80",)))
    assert [(r.text, r.why) for r in loaded.spec.tune_rules] == [("A * B <= 2", "small")]
    assert loaded.spec.tune_variants == spec.tune_variants
    assert describe_launch(loaded.spec) == describe_launch(spec)
    images = {loaded.definition.kernel_image("sm_80", "C", v)[0] for v in range(3)}
    assert len(images) == 3  # one image a kept combination, in the same order
    assert loaded.definition.kernel_image("sm_80", "C", 2)[0] == op.definition.kernel_image("sm_80", "C", 2)[0]


def test_the_magic_takes_repeated_tune_requires_options(tmp_path, monkeypatch):
    pytest.importorskip("IPython")
    from IPython.testing import globalipapp

    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))
    ip = globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_cell("import torch")
    ip.run_cell_magic("pnex", '--n-threads x.numel() --tune-requires "A * B <= 4" --tune-requires A != B -o rep', '''
def scaled_magic(x: In("f32", (None,)), y: Out("f32", "x"), A: Tune(1, 2, 4), B: Tune(1, 2, 4)):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * A + B
''')
    op = ip.user_ns["scaled_magic"]
    assert op._pnex.spec.tune_variants == ((1, 2), (1, 4), (2, 1), (4, 1))
    assert "Tune combinations kept: 4 of 9" in ip.user_ns["rep"].signature_html()
    x = torch.arange(4.0)
    assert op(x).tolist() == (x + 2).tolist()  # the first kept: A=1, B=2


def test_a_derived_backward_has_the_forwards_variants():
    op = pnex.jit(n_threads="x.numel()", tune_requires="A * B <= 2")(scaled)
    backward = pnex.derive_backward(op)
    assert backward.spec.tune_variants == op.spec.tune_variants == ((1, 1), (1, 2), (2, 1))
    assert [r.text for r in backward.spec.tune_rules] == ["A * B <= 2"]


def test_other_rules_keeping_as_many_combinations_are_tuned_anew(monkeypatch):
    """A stored choice is found by a slot that names the candidates; with rules, the
    candidates' variant numbers name other combinations, so the slot names those."""
    small = make_definition(scaled, n_threads="x.numel()", tune_requires="A * B <= 2")
    square = make_definition(scaled, n_threads="x.numel()", tune_requires="A == B")
    assert small.spec.tune_variants == ((1, 1), (1, 2), (2, 1))  # the same first (the build's), as many
    assert square.spec.tune_variants == ((1, 1), (2, 2), (4, 4))
    slot = [autotune._slot(d, "Fake GPU", "sm_90", "C", (4096,)) for d in (small, square)]
    assert slot[0] != slot[1]
