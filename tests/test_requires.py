"""``jit(requires=...)``: rules on a call's arguments, which every launcher enforces.

A kernel right only for some values of its scalars (a tile that must keep an interior)
computed wrong numbers without a fault when called with others.  With ``requires`` the
call is refused, before anything runs, with one ``ArgumentValueError`` naming the rule
and the values: here on the CPU simulator, under ``torch.compile``, through JAX, from a
saved artifact, and in the C++ launcher's own evaluator (built with the stand-ins of
``tests/launcher_stand_in.py``), which must agree with Python's on random conditions.
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.conditions import parse_requirements, programs, requirement_message
from pnex_magic.errors import ArgumentShapeError, ArgumentValueError, ShapeExpressionError
from pnex_magic.expressions import NameInfo
from tune_helpers import cpp_check_rules


@pnex.jit(n_threads="u.numel()", requires=["0 <= steps <= 3", "u.size(0) % 4 == 0 or steps == 0"])
def repeat_add(u: pnex.InMut("f32", (None,)), steps: pnex.Scalar("i32"), delta: pnex.Scalar("f32")):
    i = cuda.grid(1)
    if i < u.shape[0]:
        for _ in range(steps):
            u[i] += delta


def test_calls_that_keep_the_rules_run_and_those_that_break_one_are_refused_before_the_kernel_runs():
    u = torch.randn(8)
    want = u.double() + 3 * 0.5
    repeat_add(u, 3, 0.5)
    torch.testing.assert_close(u.double(), want, rtol=0, atol=1e-6)
    odd = torch.randn(7)
    before = odd.clone()
    repeat_add(odd, 0, 0.5)  # the second rule holds through its `or`
    assert torch.equal(odd, before)
    for args, message in [
        ((u, 4, 0.5), r"repeat_add\(\): the call breaks requires\[0\] `0 <= steps <= 3` \(steps = 4\)$"),
        ((u, -1, 0.5), r"requires\[0\] `0 <= steps <= 3` \(steps = -1\)$"),
        ((odd, 2, 0.5), r"requires\[1\] `u.size\(0\) % 4 == 0 or steps == 0` \(u.size\(0\) = 7, steps = 2\)$"),
    ]:
        poisoned = args[0].clone()
        with pytest.raises(ArgumentValueError, match=message) as info:
            repeat_add(*args)
        assert isinstance(info.value, ArgumentShapeError) and isinstance(info.value, ValueError)
        assert torch.equal(args[0], poisoned), "the kernel ran"


def test_torch_compile_refuses_the_call_while_tracing():
    compiled = torch.compile(lambda u, s: repeat_add(u, s, 1.0), fullgraph=True)
    u = torch.zeros(8)
    compiled(u, 2)
    assert torch.equal(u, torch.full((8,), 2.0))
    with pytest.raises(Exception, match=r"breaks requires\[0\] `0 <= steps <= 3` \(steps = 9\)"):
        compiled(torch.zeros(8), 9)


def test_jax_refuses_the_call():
    jax = pytest.importorskip("jax")
    import numpy as np

    @pnex.jit(n_threads="x.size(0)", requires="x.size(0) >= 2 * k")
    def head(x: pnex.In("f32", (None,)), k: pnex.Scalar("i32"), y: pnex.Out("f32", ("k",))):
        i = cuda.grid(1)
        if i < y.shape[0]:
            y[i] = x[i] + x[i + k]

    f = pnex.jax_op(head)
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(f(x, 3)), x[:3] + x[3:6])
    with pytest.raises(Exception, match=r"breaks requires\[0\] `x.size\(0\) >= 2 \* k` \(x.size\(0\) = 8, k = 5\)"):
        f(x, 5)


@pnex.jit(n_threads="x.numel()", requires={"x.numel() % 4 == 0": "the kernel reads whole groups of 4", "k >= 0": ""})
def group_sum(x: pnex.In("f32", (None,)), k: int, r: pnex.Out("f32", ("x.numel() // 4",))):
    i = cuda.grid(1)
    if i < r.shape[0]:
        r[i] = x[4 * i] + x[4 * i + 1] + x[4 * i + 2] + x[4 * i + 3] + k


def test_what_a_rule_means_ends_its_message():
    assert group_sum(torch.ones(8), 1).tolist() == [5.0, 5.0]
    with pytest.raises(ArgumentValueError, match=r"group_sum\(\): the call breaks requires\[0\] `x.numel\(\) % 4 == 0` "
                       r"\(x.numel\(\) = 6\): the kernel reads whole groups of 4$"):
        group_sum(torch.ones(6), 1)
    with pytest.raises(ArgumentValueError, match=r"requires\[1\] `k >= 0` \(k = -1\)$"):
        group_sum(torch.ones(8), -1)


def test_a_saved_artifact_keeps_its_rules_in_order_with_their_meanings(tmp_path):
    path = pnex.save(repeat_add, tmp_path / "repeat_add.pnex", archs=["sm_90"])
    loaded = pnex.load(path)
    assert [r.text for r in loaded._pnex.spec.requires] == ["0 <= steps <= 3", "u.size(0) % 4 == 0 or steps == 0"]
    with pytest.raises(ArgumentValueError, match=r"breaks requires\[0\] `0 <= steps <= 3` \(steps = 5\)"):
        loaded(torch.zeros(8), 5, 1.0)
    loaded = pnex.load(pnex.save(group_sum, tmp_path / "group_sum.pnex", archs=["sm_90"]))
    assert [(r.text, r.why) for r in loaded._pnex.spec.requires] == [
        ("x.numel() % 4 == 0", "the kernel reads whole groups of 4"), ("k >= 0", "")]


def _names() -> dict[str, NameInfo]:
    return {"x": NameInfo("tensor", ndim=2), "y": NameInfo("tensor", ndim=1), "n": NameInfo("scalar", integral=True),
            "m": NameInfo("scalar", integral=True), "f": NameInfo("scalar", integral=False)}


@pytest.mark.parametrize("text, problem", [
    ("steps > 0", "unknown name 'steps'"),
    ("n", "'n' is not a condition; write a comparison"),
    ("n + 1", "is not a condition"),
    ("n in (1, 2)", "only < <= > >= == != compare here"),
    ("f > 0", "scalar 'f' is not an integer"),
    ("T > 2", "names 'T', a Tune parameter: the autotuner chooses it"),
    ("out.size(0) > 2", "names 'out', an output: its sizes follow from the arguments"),
    ("n >", "is not a valid condition"),
    ("(n > 1) + 1 > 0", "is not allowed"),
])
def test_a_rule_that_is_not_a_condition_over_the_arguments_is_refused_at_definition(text, problem):
    with pytest.raises(ShapeExpressionError, match=r"kernel 'k', requires\[0\]: .*" + problem.replace("(", r"\(")
                       .replace(")", r"\)")):
        parse_requirements("k", [text], _names(), tune=["T"], outputs=["out"])


def test_requires_takes_a_string_or_a_list_of_strings():
    assert len(parse_requirements("k", "n > 0", _names())) == 1
    with pytest.raises(ShapeExpressionError, match="requires= takes a condition string, a list of them, or a dict of conditions and what each means"):
        parse_requirements("k", 3, _names())


def _random_term(rng: random.Random, depth: int = 0) -> str:
    leaves = ["n", "m", "x.size(0)", "x.shape[1]", "y.numel()", "len(y)", str(rng.randint(-5, 9))]
    if depth > 2 or rng.random() < 0.4:
        return rng.choice(leaves)
    kind = rng.randrange(4)
    if kind == 0:
        return f"({_random_term(rng, depth + 1)} {rng.choice(['+', '-', '*'])} {_random_term(rng, depth + 1)})"
    if kind == 1:  # divisors are nonzero constants: Python's `and` short-circuits, the launchers do not
        return f"({_random_term(rng, depth + 1)} {rng.choice(['//', '%'])} {rng.choice([-3, -2, 2, 3, 7])})"
    if kind == 2:
        return f"{rng.choice(['min', 'max'])}({_random_term(rng, depth + 1)}, {_random_term(rng, depth + 1)})"
    return f"-{_random_term(rng, depth + 1)}"


def _random_condition(rng: random.Random, depth: int = 0) -> str:
    ops = ["<", "<=", ">", ">=", "==", "!="]
    kind = rng.randrange(5) if depth < 2 else 0
    if kind <= 1:
        return f"{_random_term(rng)} {rng.choice(ops)} {_random_term(rng)}"
    if kind == 2:
        return f"{_random_term(rng)} {rng.choice(ops)} {_random_term(rng)} {rng.choice(ops)} {_random_term(rng)}"
    if kind == 3:
        joined = f" {rng.choice(['and', 'or'])} ".join(f"({_random_condition(rng, depth + 1)})" for _ in range(rng.randint(2, 3)))
        return joined
    return f"not ({_random_condition(rng, depth + 1)})"


def _random_cases(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        text = _random_condition(rng)
        env = {"x": torch.empty(rng.randint(0, 6), rng.randint(0, 6), device="meta"),
               "y": torch.empty(rng.randint(0, 9), device="meta"), "n": rng.randint(-6, 6), "m": rng.randint(-6, 6)}
        cases.append({"text": text, "env": env, "want": bool(eval(text, {"min": min, "max": max, "len": len}, dict(env)))})
    return cases


def test_random_conditions_evaluate_as_python_does():
    seed = random.randrange(2**32)
    for case in _random_cases(seed, 400):
        [rule] = parse_requirements("k", case["text"], _names())
        assert bool(rule.condition.evaluate(case["env"])) == case["want"], (seed, case["text"], case["env"])


@pytest.mark.slow
def test_the_cpp_launcher_evaluates_rules_and_words_their_messages_as_python_does(built_launcher, stand_in, pnex_env):
    """The C++ launcher's evaluator (its ``check_rules`` test entry: the code its argument
    checks run) on 300 random conditions: the same truth value as Python, and for a
    broken rule the same message as the Python launchers."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    order = ["x", "y", "n", "m"]
    index_of = order.index
    cases, expected = [], []
    for case in _random_cases(seed, 300):
        rules = parse_requirements("k", {case["text"]: rng.choice(["", "it must hold"])}, _names())
        env = case["env"]
        cases.append({"rules": programs(rules, index_of), "sizes": [list(env["x"].shape), list(env["y"].shape), [], []],
                      "ints": [0, 0, env["n"], env["m"]]})
        broken = "" if case["want"] else requirement_message(
            "k", 0, rules[0], [t.evaluate(env) for t in rules[0].terms])
        expected.append((broken, [int(case["want"])], case["text"]))
    got = cpp_check_rules("k", cases, built_launcher, stand_in, pnex_env)
    for (message, values), (want_message, want_values, text) in zip(got, expected, strict=True):
        assert (message, values) == (want_message, want_values), (seed, text)


def test_the_cpp_opcodes_are_the_python_ones():
    """csrc/launcher.h's ``enum Op`` mirrors :data:`pnex_magic.expressions.OPCODES`."""
    from pathlib import Path

    from pnex_magic.expressions import OPCODES

    header = (Path(pnex.__file__).parent / "csrc" / "launcher.h").read_text()
    enum = re.search(r"enum Op : int64_t \{(.*?)\};", header, re.S).group(1)
    cpp = {name: int(code) for name, code in re.findall(r"([A-Z]+) = (\d+)", enum)}
    names = {"CONST": "const", "SIZE": "size", "NUMEL": "numel", "SCALAR": "scalar", "ADD": "+", "SUB": "-",
             "MUL": "*", "FLOORDIV": "//", "MOD": "%", "NEG": "neg", "MIN": "min", "MAX": "max", "LT": "<",
             "LE": "<=", "GT": ">", "GE": ">=", "EQ": "==", "NE": "!=", "AND": "and", "OR": "or", "NOT": "not"}
    assert {names[n]: code for n, code in cpp.items()} == OPCODES


def test_the_magic_takes_repeated_requires_options(tmp_path, monkeypatch):
    IPython = pytest.importorskip("IPython")  # noqa: N806
    from IPython.testing import globalipapp

    del IPython
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))
    ip = globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_cell("import torch")
    ip.run_cell_magic("pnex", '--n-threads x.numel() --requires "x.numel() % 4 == 0" --requires 0 <= k < 4 -o rep', '''
def rotate_k(x: In("f32", (None,)), k: int, r: Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        r[i] = x[i - i % 4 + (i % 4 + k) % 4]
''')
    op = ip.user_ns["rotate_k"]
    assert re.search(r"a call must keep <code[^>]*>x.numel\(\) % 4 == 0</code>; <code[^>]*>0 &lt;= k &lt; 4</code>",
                     ip.user_ns["rep"].signature_html())
    assert [r.text for r in op._pnex.spec.requires] == ["x.numel() % 4 == 0", "0 <= k < 4"]
    assert op(torch.arange(4.0), 3).tolist() == [3.0, 0.0, 1.0, 2.0]
    with pytest.raises(ArgumentValueError, match=r"requires\[1\] `0 <= k < 4` \(k = 4\)"):
        op(torch.arange(4.0), 4)


@pytest.mark.gpu
def test_on_the_gpu_each_launcher_refuses_the_call_with_the_same_words(launcher, gpu_cache):
    """The C++ launcher (its own check, in csrc/launcher_call.cpp) and the Python driver
    launcher refuse alike; the kernel does not run."""
    u = torch.randn(8, device="cuda")
    repeat_add(u, 2, 0.5)  # (the C++ launcher may serve only once built: the first call builds it)
    for args, message in [
        ((u, 4, 0.5), r"^repeat_add\(\): the call breaks requires\[0\] `0 <= steps <= 3` \(steps = 4\)$"),
        ((u[:7], 2, 0.5), r"^repeat_add\(\): the call breaks requires\[1\] `u.size\(0\) % 4 == 0 or steps == 0` "
                          r"\(u.size\(0\) = 7, steps = 2\)$"),
    ]:
        before = args[0].clone()
        with pytest.raises(ArgumentValueError, match=message):
            repeat_add(*args)
        torch.cuda.synchronize()
        assert torch.equal(args[0], before)
    if launcher == "native":
        assert repeat_add._native, "the C++ launcher did not serve the op"
