"""The derived backward against PyTorch's autograd on random kernels, and the mutation
tests of the derivative rules (pnex_magic.adjoint.rules).

Random expression trees over the supported operations become a kernel (written to a
file, so that pnex reads its source as a user's) and the same expression in PyTorch.
Gradients of every input tensor are compared at random points, in float64.  Domains
are kept by construction (``log``, ``sqrt``, powers and divisors take ``1.25 + e * e``;
``tan`` takes ``0.5 * tanh(e)``), and a point whose values or gradients are huge is
drawn again.  Each run draws new trees; a failure prints the seed and the kernel.

The mutation tests change one rule of the table (a sign, a dropped chain-rule factor,
a wrong function) and check that the same comparison fails: the tests would catch it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import random

import pytest
import torch

from pnex_magic.adjoint import rules

F64 = torch.float64
N = 16
UNARY = ["pos", "neg", "reciprocal", "exp", "expm1", "log", "log1p", "sin", "cos", "tan", "tanh", "sqrt", "erf", "fabs", "abs", "cast"]
BINARY = ["add", "sub", "mul", "div", "pow_int", "pow", "mpow", "min", "max", "atan2", "hypot", "mod"]


def _positive(e):
    return ("positive", e)


def tree(rng: random.Random, depth: int, leaves: list[str], ops: list[str] | None = None):
    """A random expression: ``(op, *children)`` or a leaf's text."""
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(leaves)
    op = rng.choice(ops or UNARY + BINARY)
    if op in UNARY:
        child = tree(rng, depth - 1, leaves)
        if op in ("log", "sqrt", "log1p", "reciprocal"):
            child = _positive(child)
        elif op == "tan":
            child = ("tanhalf", child)
        return (op, child)
    left, right = tree(rng, depth - 1, leaves), tree(rng, depth - 1, leaves)
    if op in ("div", "mod"):
        right = _positive(right)
    elif op in ("pow", "mpow"):
        left = _positive(left)
    elif op == "pow_int":
        right = rng.choice(["2", "3"])
    return (op, left, right)


_KERNEL = {
    "pos": "(+{0})", "neg": "(-{0})", "reciprocal": "(1.0 / {0})", "exp": "math.exp({0})", "expm1": "math.expm1({0})", "log": "math.log({0})",
    "log1p": "math.log1p({0})", "sin": "math.sin({0})", "cos": "math.cos({0})", "tan": "math.tan({0})",
    "tanh": "math.tanh({0})", "sqrt": "math.sqrt({0})", "erf": "math.erf({0})", "fabs": "math.fabs({0})",
    "abs": "abs({0})", "cast": "float({0})", "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
    "div": "({0} / {1})", "pow_int": "({0} ** {1})", "pow": "({0} ** {1})", "mpow": "math.pow({0}, {1})",
    "min": "min({0}, {1})", "max": "max({0}, {1})", "atan2": "math.atan2({0}, {1})",
    "hypot": "math.hypot({0}, {1})", "mod": "({0} % {1})", "positive": "(1.25 + {0} * {0})",
    "tanhalf": "(0.5 * math.tanh({0}))",
}
#: The largest quotient x / y of a float ``x % y`` at a compared point: past it the result
#: depends on the last bits of x (an ulp of exp(t0) moves it across the whole period),
#: which the simulator's and torch's exp need not share.
MOD_QUOTIENT = 2.0 ** 20


def gpu_mod(x, y):
    """A float ``x % y`` as a pnex kernel computes it on the GPU and in the simulator, with
    torch's autograd: Python's sign rule over NVVM's ``frem``, ``|x| - floor(|x| / |y|) *
    |y|`` with ``x``'s sign, each operation rounded (pnex_magic.simtyping.runtime). Where
    the quotient is large this is not the exact remainder ``torch.remainder`` gives: at
    ``exp(40) % 1.4142`` the GPU's is 0.0 and the exact one 0.906 (a random case of
    2026-11-28 failed on that, in CI, comparing against ``torch.remainder``)."""
    ax, ay = x.abs(), y.abs()
    m = torch.copysign(ax - torch.floor(ax / ay) * ay, x)
    return torch.where((m != 0) & ((y < 0) != (m < 0)), m + y, m)


_TORCH = {
    "pos": lambda x: x, "neg": lambda x: -x, "reciprocal": lambda x: 1.0 / x, "exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh, "sqrt": torch.sqrt,
    "erf": torch.erf, "fabs": torch.abs, "abs": torch.abs, "cast": lambda x: x, "add": torch.add,
    "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow_int": lambda x, n: x ** int(n),
    "pow": torch.pow, "mpow": torch.pow, "min": torch.minimum, "max": torch.maximum, "atan2": torch.atan2,
    "hypot": torch.hypot, "mod": gpu_mod, "positive": lambda x: 1.25 + x * x,
    "tanhalf": lambda x: 0.5 * torch.tanh(x),
}


def kernel_text(node) -> str:
    if isinstance(node, str):
        return node
    return _KERNEL[node[0]].format(*(kernel_text(c) for c in node[1:]))


def torch_value(node, env):
    if isinstance(node, str):  # constants and the scalar as tensors: torch's functions take tensors
        return env[node] if node in env else torch.full_like(env["a[i]"], float(node)).detach()
    if node[0] == "pow_int":
        return _TORCH["pow_int"](torch_value(node[1], env), node[2])
    args = [torch_value(c, env) for c in node[1:]]
    if node[0] == "mod":  # the largest quotient of a %: how many of x's last bits its result depends on
        quotient = float((args[0] / args[1]).detach().abs().max())
        env["mod quotient"] = max(env.get("mod quotient", 0.0), quotient)
    return _TORCH[node[0]](*args)


@dataclasses.dataclass
class Case:
    """A random kernel: ``t0 = first``, then ``y[i] = then if test > 0 else other``
    (``test`` may be absent: ``y[i] = then``), and ``w`` a local that is the sum of a
    trip loop, ``w += b[i] * k``."""

    first: object
    then: object
    test: object = None
    other: object = None
    #: a 1-D stencil: the expressions read a[i - 1] and a[i + 1] at interior points (the
    #: derived backward gathers a's gradient from the neighbours), y[i] = a[i] at the ends
    neighbours: bool = False

    def source(self, name: str) -> str:
        body = [f"        y[i] = {kernel_text(self.then)}"]
        if self.test is not None:
            body = [f"        if {kernel_text(self.test)} > 0.0:",
                    f"            y[i] = {kernel_text(self.then)}",
                    "        else:",
                    f"            y[i] = {kernel_text(self.other)}"]
        body = ["        w = 0.0", "        for k in range(3):", "            w += b[i] * k",
                f"        t0 = {kernel_text(self.first)}", *body]
        if self.neighbours:
            body = ["        if 0 < i < a.shape[0] - 1:", *("    " + line for line in body),
                    "        else:", "            y[i] = a[i]"]
        return "\n".join([
            "import math",
            "from numba import cuda",
            "import pnex_magic as pnex",
            "",
            "",
            f'def {name}(a: pnex.In("f64", (None,)), b: pnex.In("f64", "a"), c: pnex.In("f64", "a"),',
            '        s: pnex.Scalar("f64"), y: pnex.Out("f64", "a")):',
            "    i = cuda.grid(1)",
            "    if i < a.shape[0]:",
            *body,
        ]) + "\n"

    def reference(self, a, b, c, s, seen=None):
        """y as PyTorch computes it; ``seen`` (a dict) gets the largest quotient of a
        float ``%`` (``"mod quotient"``)."""
        inner = slice(1, -1) if self.neighbours else slice(None)
        env = {"a[i]": a[inner], "b[i]": b[inner], "c[i]": c[inner], "a[i - 1]": a[:-2], "a[i + 1]": a[2:]}
        env["s"] = torch.full_like(env["a[i]"], s).detach()
        env["w"] = 3.0 * env["b[i]"]
        env["t0"] = torch_value(self.first, env)
        then = torch_value(self.then, env)
        if self.test is None:
            y = then + torch.zeros_like(env["a[i]"])
        else:
            y = torch.where(torch_value(self.test, env) > 0, then, torch_value(self.other, env))
        if seen is not None:
            seen["mod quotient"] = env.get("mod quotient", 0.0)
        return torch.cat([a[:1], y, a[-1:]]) if self.neighbours else y


def random_case(rng: random.Random, ops: list[str] | None = None, neighbours: bool = False) -> Case:
    leaves = ["a[i]", "b[i]", "c[i]", "s", "0.75", "w"] + (["a[i - 1]", "a[i + 1]"] if neighbours else [])
    first = tree(rng, 3, leaves, ops)
    then = tree(rng, 3, leaves + ["t0"], ops)
    if rng.random() < 0.4:
        return Case(first, then, tree(rng, 2, leaves + ["t0"]), tree(rng, 3, leaves + ["t0"], ops), neighbours)
    return Case(first, then, neighbours=neighbours)


_counter = itertools.count()


def define(case: Case, tmp_path):
    """The case's kernel as a pnex op with its derived backward (a module of its own)."""
    import pnex_magic as pnex

    name = f"random_kernel_{os.getpid()}_{next(_counter)}"
    path = tmp_path / f"{name}.py"
    path.write_text(case.source(name))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return pnex.jit(n_threads="a.numel()", threads_per_block=32, backward="auto")(getattr(module, name))


class NoPoint(AssertionError):
    """No point of 40 drawn was away from the expression's singularities (an element of
    ``N`` near a pole of ``w ** (1 / a)``, say): a random test draws another kernel."""


def compare(case: Case, op, rng: random.Random, points: int = 3) -> str | None:
    """``None`` when the derived gradients match PyTorch's at ``points`` random points,
    else what differs; raises :class:`NoPoint` where no point could be checked."""
    tried = 0
    checked = 0
    while checked < points and tried < 40:
        tried += 1
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        a, b, c = (torch.rand(N, generator=g, dtype=F64) * 3 - 1.5 for _ in range(3))
        s = rng.uniform(-1.5, 1.5)
        theirs = [t.clone().requires_grad_() for t in (a, b, c)]
        seen = {}
        expected = case.reference(*theirs, s, seen)
        if seen["mod quotient"] > MOD_QUOTIENT:
            continue  # a % whose result hangs on the last bits of its dividend: draw another point
        weight = torch.randn(N, generator=g, dtype=F64)
        if expected.requires_grad:  # else the expression is constant: no gradient anywhere
            (expected * weight).sum().backward()
        grads = [torch.zeros(N, dtype=F64) if t.grad is None else t.grad for t in theirs]
        if not torch.isfinite(expected).all() or expected.abs().max() > 1e4 or \
                not all(torch.isfinite(gr).all() and gr.abs().max() < 1e5 for gr in grads):
            continue  # near a singularity: draw another point
        checked += 1
        mine = [t.clone().requires_grad_() for t in (a, b, c)]
        y = op(*mine, s)
        if not torch.allclose(y, expected.detach(), rtol=1e-9, atol=1e-9):  # the seed goes with the message
            worst = (y - expected.detach()).abs().argmax().item()
            return f"y[{worst}]: kernel {y[worst].item()!r}, torch {expected[worst].item()!r}"
        (y * weight).sum().backward()
        for name, m, t in zip("abc", mine, grads):
            if not torch.allclose(m.grad, t, rtol=1e-7, atol=1e-9):
                worst = (m.grad - t).abs().argmax().item()
                return f"grad of {name}[{worst}]: derived {m.grad[worst].item()!r}, torch {t[worst].item()!r}"
    if not checked:
        raise NoPoint("no point away from singularities was found")
    return None


def compared_cases(rng: random.Random, draw, tmp_path, count: int, limit: int = 40):
    """``count`` pairs (case, what differs) of kernels ``draw(rng)`` makes that have points
    to compare at (those that have none are drawn again, at most ``limit`` in all)."""
    found = []
    for _ in range(limit):
        case = draw(rng)
        op = define(case, tmp_path)
        try:
            found.append((case, op, compare(case, op, rng)))
        except NoPoint:
            continue
        if len(found) == count:
            return found
    raise AssertionError(f"only {len(found)} of {limit} random kernels had a point away from their singularities")


@pytest.mark.parametrize("neighbours", [False, True], ids=["elementwise", "stencil"])
def test_random_kernels_match_pytorch_autograd(tmp_path, neighbours):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    for case, op, problem in compared_cases(rng, lambda r: random_case(r, neighbours=neighbours), tmp_path, 8):
        assert problem is None, f"seed {seed}: {problem}\n{case.source('k')}\n{op.backward_source}"


def test_a_kernel_nvvm_rejects_with_line_info_compiles_without_it(tmp_path):
    """NVVM fails (ERROR_COMPILATION, no log) on this kernel's derived backward when it
    carries line info, and compiles it without (pnex_magic/compiler.py falls back)."""
    case = Case(("hypot", ("erf", ("atan2", "w", "w")), ("tan", ("tanhalf", "a[i]"))),
                ("mod", ("tan", ("tanhalf", ("hypot", "c[i]", "0.75"))),
                 _positive(("max", ("mul", "a[i]", "b[i]"), ("sin", "b[i]")))))
    assert compare(case, define(case, tmp_path), random.Random()) is None


def test_the_generator_covers_the_rule_table():
    """Every rule is drawn (``pow`` with an exponent no gradient flows through, such as
    ``s``, is ``pow_exponent``), except ``floordiv``, whose derivative is zero (PyTorch has
    none to compare with: tests/test_adjoint_refused.py checks it)."""
    assert set(UNARY + BINARY) | {"pow_exponent", "floordiv"} == set(rules.RULES)


# ------------------------------------------------------------------------ mutations
MUTATIONS = [
    ("exp", 0, "-{g} * {r}"),  # a flipped sign
    ("mul", 1, "{g}"),  # a dropped chain-rule factor
    ("div", 1, "({g} / {b}) * {r}"),
    ("reciprocal", 1, "{g} * {r} * {r}"),
    ("tanh", 0, "{g} * ({one} + {r} * {r})"),
    ("sin", 0, "{g} * {math}.sin({a})"),  # the wrong function
    ("atan2", 0, "{g} * {b} / ({a} * {a})"),
    ("pow_int", 0, "{g} * {a} ** {km1}"),  # the exponent's factor dropped
    ("max", 0, "({g} if {a} <= {b} else {zero})"),  # the wrong argument
    ("log1p", 0, "{g} / {a}"),
    ("erf", 0, "{g} * {math}.exp(-({a} * {a}))"),  # a dropped constant
    ("sqrt", 0, "{g} / {r}"),
    ("hypot", 1, "{g} * {a} / {r}"),
    ("sub", 1, "{g}"),
    ("neg", 0, "{g}"),
]


@pytest.mark.parametrize("rule,index,template", MUTATIONS, ids=[f"{r}-{i}" for r, i, _ in MUTATIONS])
def test_a_mutated_rule_is_caught(rule, index, template, tmp_path, monkeypatch):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    original = rules.RULES[rule]
    partials = list(original.partials)
    partials[index] = template
    monkeypatch.setitem(rules.RULES, rule, dataclasses.replace(original, partials=tuple(partials)))
    # the operation on the inputs (its arguments), in a random tree around it
    kind = rule
    args = ["a[i]", "b[i]"]
    core = (kind, args[0]) if rule in UNARY else (kind, args[0], "3" if rule == "pow_int" else args[1])
    if rule in ("log1p", "sqrt", "reciprocal"):
        core = (kind, _positive("a[i]"))
    [(_, _, problem)] = compared_cases(rng, lambda r: Case(tree(r, 1, ["c[i]", "s"]), ("add", core, ("mul", "t0", "c[i]"))),
                                       tmp_path, 1)
    assert problem is not None, f"seed {seed}: mutating {rule} went unnoticed"


def test_a_remainder_that_hangs_on_its_dividends_last_bits_is_not_compared(tmp_path):
    """The random case CI failed on (2026-11-28): ``exp(t0) % d`` with t0 from 37 to 167,
    quotients past 10**15, where the kernel's ``%`` (the GPU's rule) gave 0.0 and
    ``torch.remainder`` the exact remainder, so ``test > 0`` chose the other branch at 6
    of 16 points.  Such points are not compared (:data:`MOD_QUOTIENT`), and the
    reference follows the GPU's rule (:func:`gpu_mod`)."""
    case = Case(first=("pow_int", ("exp", ("pow", ("positive", "c[i]"), "0.75")), "2"), then=("sin", "b[i]"),
                test=("mod", ("exp", "t0"), ("positive", ("reciprocal", ("positive", "c[i]")))),
                other=("exp", ("neg", ("abs", "s"))))
    with pytest.raises(NoPoint):
        compare(case, define(case, tmp_path), random.Random(5))
    x = torch.exp(torch.tensor([40.0], dtype=F64))
    assert gpu_mod(x, torch.tensor([1.4142], dtype=F64)).item() == 0.0
    assert torch.remainder(x, torch.tensor([1.4142], dtype=F64)).item() > 0.9


DEAD_VALUES = {
    # CI's case: the overflow is inside the dead statements (their own adjoints were 0 * cos(inf))
    "ci-2026-11-29": ("sin", ("mpow", ("positive", ("exp", "s")), ("pow", ("positive", "w"), "w"))),
    # the overflow is in a partial into w, which an output does read: 0 * exp(exp(exp(4.5)))
    "into-a-live-value": ("mul", "w", ("exp", ("exp", ("exp", "w")))),
}


@pytest.mark.parametrize("first", list(DEAD_VALUES))
def test_a_value_no_output_reads_has_no_derivative_terms(tmp_path, first):
    """The random case CI failed on (2026-11-29, seed 3501712953): ``t0 = sin(pow(1.25 +
    exp(s)**2, (1.25 + w*w) ** w))`` overflows to inf where ``w = 3 * b[i]`` is large, and
    no output reads ``t0``.  Its derivative terms were written all the same, ``0 * cos(inf)``,
    and b's gradient came out NaN where PyTorch's, which never visits ``t0``, is finite.
    Only values an output depends on get adjoints (:func:`pnex_magic.adjoint.ir.useful_values`),
    and a statement whose value none depends on adds nothing, even to a value one does."""
    case = Case(first=DEAD_VALUES[first],
                then=("div", ("expm1", ("fabs", "0.75")), ("positive", ("erf", ("cast", "w")))))
    op = define(case, tmp_path)
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    a, b, c = (torch.rand(N, generator=g, dtype=F64) * 3 - 1.5 for _ in range(3))
    b[::2] = 1.5  # t0 is inf at these (w = 4.5): 21.3 ** (21.5 ** 4.5), and exp(exp(exp(4.5)))
    theirs = [t.clone().requires_grad_() for t in (a, b, c)]
    weight = torch.randn(N, generator=g, dtype=F64)
    assert not torch.isfinite(torch_value(case.first, {"s": torch.full((N,), 1.5, dtype=F64), "w": 3 * b})[::2]).any()
    (case.reference(*theirs, 1.5) * weight).sum().backward()
    mine = [t.clone().requires_grad_() for t in (a, b, c)]
    (op(*mine, 1.5) * weight).sum().backward()
    assert torch.isfinite(theirs[1].grad).all()
    torch.testing.assert_close(mine[1].grad, theirs[1].grad, rtol=1e-7, atol=1e-9)
    for m in (mine[0], mine[2]):
        assert torch.equal(m.grad, torch.zeros(N, dtype=F64))
