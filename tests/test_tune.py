"""``pnex.Tune``: compile-time constants the autotuner chooses, without a GPU.

A ``Tune`` parameter is not an argument of the op; each choice is compiled into its
own variant (the value is a constant: loops over it unroll), the tuner tries the
product of block candidates and choices, the simulator runs the first choice, and
artifacts keep every variant (or only the chosen ones).  GPU behaviour (a choice
stored and reused, every variant launched by the C++ and the Python launchers) is in
``tests/test_gpu_tune.py``.
"""

from __future__ import annotations

import re

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import ArgumentTypeError, KernelDefinitionError, Tune, cache
from pnex_magic.compiler import abi_layout
from pnex_magic.define import definition as make_definition
from pnex_magic.launch import autotune
from pnex_magic.launch.description import describe_launch
from tune_helpers import FakeClock, fake_gpu

N_THREADS = "(a.numel() + ITEMS - 1) // ITEMS"


def copy_items(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a"), ITEMS: Tune(1, 2, 4, 8)):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            r[j] = a[j]


def test_a_tune_parameter_is_a_constant_not_an_argument():
    op = pnex.jit(n_threads=N_THREADS, threads_per_block="auto")(copy_items)
    spec = op.spec
    assert spec.schema == "(Tensor a) -> Tensor" and [p.name for p in spec.arguments] == ["a"]
    assert spec.tune_variants == ((1,), (2,), (4,), (8,))
    assert len(spec.launch_candidates) == 5 * 4 and spec.launch_candidates[0] == ((256,), 0)
    assert spec.autotuned and abi_layout(spec)[2] == []  # no argument slot
    a = torch.randn(1003)  # fresh inputs, poisoned output: every element must be written
    out = op(a)
    assert torch.equal(out, a)
    assert "ITEMS: Tune(1, 2, 4, 8)" in spec.describe()


def test_each_choice_compiles_to_its_own_unrolled_variant():
    d = make_definition(copy_items, n_threads=N_THREADS)
    loads = []
    for variant, (items,) in enumerate(d.spec.tune_variants):
        compiled = d.compiled("sm_90", variant=variant)
        assert compiled.variant == variant
        loads.append(compiled.ptx.count("ld.global.f32"))
        params = re.findall(r"\.param \.\w+ \S+_param_\d+", compiled.ptx)
        assert len(params) == 14  # two 1-D arrays of 7 slots; ITEMS has none
    assert loads == [1, 2, 4, 8]  # the loop over a constant is unrolled
    keys = {d.cache_key("sm_90", "C", v) for v in range(4)}
    assert len(keys) == 4


def test_simulator_runs_the_first_choice_also_in_n_threads():
    def which(a: pnex.In("f32", (None,)), seen: pnex.Out("i64", (2,), init=0), K: Tune(3, 5)):
        i = cuda.grid(1)
        if i == 0:
            seen[0] = K
        if i < a.shape[0]:
            cuda.atomic.add(seen, 1, 1)

    op = pnex.jit(n_threads="a.numel() // K + 1", threads_per_block=4)(which)
    seen = op(torch.zeros(10))
    assert seen.tolist() == [3, 10 // 3 + 1]
    tuned = autotune.result_for(op.definition, (torch.zeros(10),))
    assert tuned.candidates[tuned.choice].tune == (("K", 3),) and "simulator" in tuned.source


def test_one_choice_is_a_plain_constant_usable_in_shapes():
    def tiles(a: pnex.In("f32", (None,)), T: Tune(4), out: pnex.Out("f32", ("(a.size(0) + T - 1) // T",))):
        i = cuda.grid(1)
        if i < out.shape[0]:
            acc = 0.0
            for k in range(T):
                j = i * T + k
                if j < a.shape[0]:
                    acc += a[j]
            out[i] = acc

    op = pnex.jit(n_threads="out.numel()", threads_per_block=8)(tiles)
    assert not op.spec.autotuned
    a = torch.randn(10, dtype=torch.float32)
    expected = torch.nn.functional.pad(a.double(), (0, 2)).view(3, 4).sum(1)
    torch.testing.assert_close(op(a).double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "annotation, n_threads, pattern",
    [
        ("Tune()", N_THREADS, r"parameter 'ITEMS': Tune\(\) needs at least one choice"),
        ("Tune(1, 2.0)", N_THREADS, r"parameter 'ITEMS': Tune choices must be ints, floats or bools, all of one kind"),
        ("Tune(1, '2')", N_THREADS, r"parameter 'ITEMS': .*'2' is a str"),
        ("Tune(2, 2)", N_THREADS, r"parameter 'ITEMS': Tune choices repeat a value"),
        ("Tune(0, 4)", N_THREADS, r"with the Tune choice ITEMS=0, n_threads\[0\] = .* divides by zero"),
        ("Tune(-4, 4)", "a.numel() // ITEMS", r"with the Tune choice ITEMS=-4, n_threads\[0\] = a.numel\(\) // ITEMS gives"),
    ],
)
def test_bad_choices_are_named(annotation, n_threads, pattern):
    namespace = {"pnex": pnex, "Tune": Tune, "cuda": cuda}
    exec(  # noqa: S102 -- a kernel whose annotation is the case under test
        f"def k(a: pnex.In('f32', (None,)), r: pnex.Out('f32', 'a'), ITEMS: {annotation}):\n    pass\n", namespace
    )
    with pytest.raises(KernelDefinitionError, match=pattern):
        make_definition(namespace["k"], n_threads=n_threads)


def test_tuned_values_stay_out_of_shapes_and_keys_and_defaults():
    def shaped(a: pnex.In("f32", (None,)), K: Tune(1, 2), r: pnex.Out("f32", ("a.size(0) * K",))):
        pass

    with pytest.raises(KernelDefinitionError, match=r"parameter 'r''s shape \(axis 0\) uses the Tune parameter 'K'"):
        make_definition(shaped, n_threads="a.numel()")
    with pytest.raises(KernelDefinitionError, match=r"autotune_key\[0\] uses the Tune parameter 'ITEMS'"):
        make_definition(copy_items, n_threads=N_THREADS, autotune_key=("a.size(0) * ITEMS",))

    def defaulted(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a"), K: Tune(1, 2) = 1):
        pass

    with pytest.raises(KernelDefinitionError, match="parameter 'K' is a Tune parameter with a default value"):
        make_definition(defaulted, n_threads="a.numel()")


def test_overrides_replace_choices_and_name_what_is_not_tunable():
    d = make_definition(copy_items, n_threads=N_THREADS, tune={"ITEMS": (2, 16)})
    assert d.spec.tune_variants == ((2,), (16,))
    with pytest.raises(KernelDefinitionError, match=r"choices are given for 'a', which is an In parameter, not a Tune"):
        make_definition(copy_items, n_threads=N_THREADS, tune={"a": (1, 2)})
    with pytest.raises(KernelDefinitionError, match=r"choices are given for 'ITEM', which is not a parameter"):
        make_definition(copy_items, n_threads=N_THREADS, tune={"ITEM": (1, 2)})


def test_a_caller_passing_a_tune_value_is_told_it_is_chosen():
    op = pnex.jit(n_threads=N_THREADS)(copy_items)
    with pytest.raises(ArgumentTypeError, match=r"'ITEMS' is a Tune parameter: the autotuner chooses it"):
        op(torch.randn(8), 4)
    with pytest.raises(ArgumentTypeError, match=r"'ITEMS' is a Tune parameter: the autotuner chooses it"):
        op(torch.randn(8), ITEMS=4)


def test_launch_description_lists_block_and_variant_per_candidate():
    d = make_definition(copy_items, n_threads=N_THREADS, threads_per_block=[128, 256])
    launch = describe_launch(d.spec)
    assert launch["candidates"] == [[128, 1, 1, 0], [256, 1, 1, 0], [128, 1, 1, 1], [256, 1, 1, 1],
                                    [128, 1, 1, 2], [256, 1, 1, 2], [128, 1, 1, 3], [256, 1, 1, 3]]
    assert launch["tune"] == [2] and launch["variants"] == [[1], [2], [4], [8]]
    assert launch["params"][2]["kind"] == 5


def _items_threads(spec):
    """The call's threads with each variant's ITEMS (4096 elements)."""
    return lambda variant: ((4096 + spec.tune_variants[variant][0] - 1) // spec.tune_variants[variant][0],)


def test_tuner_tries_blocks_times_choices_and_reuses_the_stored_choice(monkeypatch, fresh_cache):
    fake_gpu(monkeypatch)
    d = make_definition(copy_items, n_threads=N_THREADS, threads_per_block=[128, 256])
    times = {(b, i): 10e-6 / i + (1e-6 if b == 128 else 0) for b in (128, 256) for i in (1, 2, 4, 8)}
    times[(256, 4)] = 1e-6  # the fastest
    fake = FakeClock(d.spec, times, _items_threads(d.spec))
    monkeypatch.setattr(autotune, "_device_seconds", fake.seconds)
    choice, final = autotune.choose(d, device_index=0, layout="C", key=(4096,), capturing=False, runner=fake.runner)
    assert d.spec.launch_candidates[choice] == ((256,), 2) and final
    result = autotune._RESULTS[d][(0, "C", (4096,))]
    assert result.tune == (("ITEMS", 4),) and result.variant == 2
    assert result.seconds_total is not None and result.seconds_total >= 0
    assert len([c for c in result.candidates if c.seconds is not None]) == 8
    assert "256, ITEMS=4" in "\n".join(result.lines())
    [record] = cache.records(autotune.RECORD_KIND)
    assert record.data["choice"] == [256] and record.data["choice_tune"] == [4]
    # a new process: the stored choice, nothing timed
    again = make_definition(copy_items, n_threads=N_THREADS, threads_per_block=[128, 256])
    never = FakeClock(again.spec, {}, _items_threads(again.spec))
    never.run = lambda index: pytest.fail("benchmarked again")
    assert autotune.choose(again, device_index=0, layout="C", key=(4096,), capturing=False,
                           runner=never.runner) == (choice, True)


def test_artifacts_keep_every_variant_or_only_the_chosen_ones(tmp_path, monkeypatch):
    op = pnex.jit(n_threads=N_THREADS, threads_per_block=[128, 256])(copy_items)
    every = pnex.save(op, tmp_path / "all.pnex", archs=("sm_80",))
    with pytest.raises(pnex.ArtifactError, match="tuned_only=True: the autotuner has not chosen"):
        pnex.save(op, tmp_path / "tuned.pnex", archs=("sm_80",), tuned_only=True)
    # pretend a GPU chose ITEMS=8 for one key
    chosen = autotune.TuneResult(
        "copy_items", (4096,), "a.size(0)=4096", tuple(autotune._rows(op.spec)), 7, "benchmarked", "Fake GPU", 0.1
    )
    autotune._remember(op.definition, (0, "C", (4096,)), chosen)
    tuned = pnex.save(op, tmp_path / "tuned.pnex", archs=("sm_80",), tuned_only=True)
    items8 = op.definition.kernel_image("sm_80", "C", 3)[0]
    spec = op.spec

    loaded = pnex.load(every)  # replaces the op of that name
    assert loaded.spec.tune_variants == spec.tune_variants
    assert describe_launch(loaded.spec) == describe_launch(spec)
    assert len({loaded.definition.kernel_image("sm_80", "C", v)[0] for v in range(4)}) == 4
    small = pnex.load(tuned)
    assert small.spec.tune_variants == ((8,),) and not small.spec.tune_params[0].tuned
    assert small.definition.kernel_image("sm_80", "C", 0)[0] == items8


def test_jax_runs_a_tuned_kernel_with_its_first_choice_on_cpu():
    jax = pytest.importorskip("jax")
    import numpy as np

    op = pnex.jit(n_threads=N_THREADS, threads_per_block=[8, 16])(copy_items)
    f = pnex.jax_op(op)
    x = np.random.default_rng().standard_normal(37).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), x)
