"""The shape / n_threads expression language: parsing, printing, evaluation, the
postfix program, and shapes built from expressions in real kernels."""

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import ArgumentShapeError, ShapeExpressionError
from pnex_magic.expressions import (
    MAX_STACK_DEPTH,
    OPCODES,
    BinOp,
    Const,
    MinMax,
    NameInfo,
    Neg,
    Numel,
    ScalarRef,
    Size,
    parse_expression,
    stack_depth,
)

NAMES = {
    "a": NameInfo("tensor", ndim=2),
    "v": NameInfo("tensor", ndim=1),
    "n": NameInfo("scalar", integral=True),
    "x": NameInfo("scalar", integral=False),
}
ENV = {"a": torch.empty(6, 10), "v": torch.empty(7), "n": 4, "x": 0.5}
ORDER = ["a", "v", "n", "x"]


def parse(text, axis=None):
    return parse_expression(text, NAMES, where="test", axis=axis)


def run_program(program, env=ENV, order=ORDER):
    """A reference interpreter of the postfix program (what the C++ launcher runs)."""
    inv = {code: name for name, code in OPCODES.items()}
    stack = []
    for op, a, b in program:
        name = inv[op]
        if name == "const":
            stack.append(a)
        elif name == "size":
            stack.append(env[order[a]].shape[b])
        elif name == "numel":
            stack.append(env[order[a]].numel())
        elif name == "scalar":
            stack.append(env[order[a]])
        elif name == "neg":
            stack.append(-stack.pop())
        else:
            right, left = stack.pop(), stack.pop()
            stack.append(
                {
                    "+": lambda: left + right,
                    "-": lambda: left - right,
                    "*": lambda: left * right,
                    "//": lambda: left // right,
                    "%": lambda: left % right,
                    "min": lambda: min(left, right),
                    "max": lambda: max(left, right),
                }[name]()
            )
        run_program.deepest = max(getattr(run_program, "deepest", 0), len(stack))
    assert len(stack) == 1
    return stack[0]


CASES = [
    ("3", 3, Const(3)),
    ("a.size(0)", 6, Size("a", 0)),
    ("a.size(-1)", 10, Size("a", 1)),
    ("a.shape[1]", 10, Size("a", 1)),
    ("a.shape[-2]", 6, Size("a", 0)),
    ("a.numel()", 60, Numel("a")),
    ("len(v)", 7, Size("v", 0)),
    ("n", 4, ScalarRef("n")),
    ("n * 2", 8, BinOp("*", ScalarRef("n"), Const(2))),
    ("a.size(0) + v.size(0)", 13, None),
    ("a.size(1) - n", 6, None),
    ("a.numel() // 7", 8, None),
    ("a.numel() % 7", 4, None),
    ("(a.size(0) + 1) * 2", 14, None),
    ("a.size(0) + 1 * 2", 8, None),
    ("a.size(0) - (n - 1)", 3, None),
    ("a.size(0) - n - 1", 1, None),
    ("-n + 10", 6, BinOp("+", Neg(ScalarRef("n")), Const(10))),
    ("+n", 4, ScalarRef("n")),
    ("-(n * 2)", -8, None),
    ("min(a.size(0), v.size(0))", 6, MinMax("min", (Size("a", 0), Size("v", 0)))),
    ("max(a.size(0), v.size(0), n * 3)", 12, None),
    ("min(max(n, 2), 3) * a.size(1)", 30, None),
    ("(v.numel() + 255) // 256", 1, None),
    ("  a.size(0)  ", 6, Size("a", 0)),
]


@pytest.mark.parametrize("text, value, tree", CASES, ids=[c[0] for c in CASES])
def test_parse_and_evaluate(text, value, tree):
    expr = parse(text)
    if tree is not None:
        assert expr == tree
    assert expr.evaluate(ENV) == value
    # the printed form parses back to the same tree
    assert parse(str(expr)) == expr
    # the postfix program computes the same value, within the stack depth it reports
    run_program.deepest = 0
    program = expr.to_program(ORDER.index)
    assert run_program(program) == value
    assert run_program.deepest == stack_depth(program)


def test_printing_is_canonical():
    assert str(parse("a.shape[1]")) == "a.size(1)"
    assert str(parse("len(v)")) == "v.size(0)"
    assert str(parse("(a.size(0) + 1) * 2")) == "(a.size(0) + 1) * 2"
    assert str(parse("a.size(0) - (n - 1)")) == "a.size(0) - (n - 1)"
    assert str(parse("(a.size(0) - n) - 1")) == "a.size(0) - n - 1"
    assert str(parse("-(n + 1)")) == "-(n + 1)"
    assert str(parse("max(n,2)")) == "max(n, 2)"


def test_bare_tensor_name_in_shape_uses_axis():
    assert parse("a", axis=1) == Size("a", 1)
    assert parse("a + 1", axis=0).evaluate(ENV) == 7
    with pytest.raises(ShapeExpressionError, match=r"test: 'v' stands for its size on axis 1"):
        parse("v", axis=1)
    with pytest.raises(ShapeExpressionError, match=r"bare tensor name \('a'\)"):
        parse("a")


def test_int_input_is_a_constant():
    assert parse_expression(5, NAMES, where="w") == Const(5)
    with pytest.raises(ShapeExpressionError, match=r"w: expected an int or an expression string, got None"):
        parse_expression(None, NAMES, where="w")


def test_names():
    assert parse("a.size(0) + v.numel() * n").names() == frozenset({"a", "v", "n"})
    assert parse("3").names() == frozenset()
    assert parse("min(n, 2)").names() == frozenset({"n"})


def test_symbolic_evaluation():
    """Under torch.compile sizes are SymInts; min/max go through torch.sym_min/sym_max."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    a = mode.from_tensor(torch.empty(6, 10), source=ConstantSource("a"), symbolic_context=context)
    assert isinstance(a.shape[0], torch.SymInt)
    env = {"a": a, "v": torch.empty(7), "n": 4, "x": 0.5}
    value = parse("min(a.size(0), 100) * 2 + a.numel() % 7 + max(n, a.size(1))").evaluate(env)
    assert isinstance(value, torch.SymInt)
    assert int(value) == 6 * 2 + 60 % 7 + 10


def test_division_by_zero_is_an_argument_error():
    env = dict(ENV, n=0)
    for text in ("a.numel() // n", "a.numel() % n", "max(a.size(0) // (n * 2), 1)"):
        with pytest.raises(ArgumentShapeError, match=r"division by zero while evaluating .* \((n|n \* 2) = 0\)$"):
            parse(text).evaluate(env)
    assert parse("a.numel() // n").evaluate(dict(ENV, n=-4)) == -15  # floor division, as in Python
    assert parse("a.numel() % n").evaluate(dict(ENV, n=-7)) == -3


def test_nesting_depth_is_limited():
    shallow = "(n + " * 40 + "n" + ")" * 40
    assert stack_depth(parse(shallow).to_program(ORDER.index)) == 41
    deep = "(n + " * (MAX_STACK_DEPTH + 5) + "n" + ")" * (MAX_STACK_DEPTH + 5)
    with pytest.raises(ShapeExpressionError, match=r"test: expression .* is nested too deeply"):
        parse(deep)
    # a long flat sum needs no deep stack, but a very long one is refused, not a crash
    assert parse(" + ".join(["n"] * 100)).evaluate(ENV) == 400
    with pytest.raises(ShapeExpressionError, match=r"nested too deeply"):
        parse(" + ".join(["n"] * 5000))


def test_error_messages_name_the_expression():
    with pytest.raises(ShapeExpressionError, match=r"^somewhere: unknown name 'q'; the names it may use here are: a, n, v, x \(in expression 'q \+ 1'\)$"):
        parse_expression("q + 1", NAMES, where="somewhere")


# --------------------------------------------------------------------------------------
# Expressions in real kernels: output shapes and launch sizes.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads="max(out.numel(), 1)")
def shape_zoo(
    a: pnex.In("f32", (None, None)),
    b: pnex.In("f32", ("a.shape[1] * 2", None)),
    n: int,
    out: pnex.Out(
        "i64",
        (
            "n * 2",
            "(a.size(0) + a.shape[1]) // 2",
            "max(a.numel() % 5, 1)",
            "min(len(a), 3) - 1 + b.size(-1)",
        ),
        init=-1,
    ),
    first: pnex.Out("f32", ("a", "b.size(1)")),
):
    i = cuda.grid(1)
    if i < out.size:
        d3 = i % out.shape[3]
        r = i // out.shape[3]
        d2 = r % out.shape[2]
        r = r // out.shape[2]
        out[r // out.shape[1], r % out.shape[1], d2, d3] = i
    if i < first.shape[0] * first.shape[1]:
        first[i // first.shape[1], i % first.shape[1]] = a[i // first.shape[1], 0] + b[0, i % first.shape[1]]


def test_shape_expressions_in_a_kernel():
    spec = shape_zoo.spec
    assert spec.outputs[0].shape_text() == (
        "(n * 2, (a.size(0) + a.size(1)) // 2, max(a.numel() % 5, 1), min(a.size(0), 3) - 1 + b.size(1))"
    )
    assert spec.outputs[1].shape_text() == "(a.size(0), b.size(1))"
    assert spec.params[1].shape_text() == "(a.size(1) * 2, None)"
    a = torch.arange(12, dtype=torch.float32).view(4, 3)  # numel 12, 12 % 5 = 2
    b = torch.ones(6, 2)  # 6 == a.shape[1] * 2
    out, first = shape_zoo(a, b, 2)
    assert out.shape == (4, 3, 2, 4)  # (2*2, (4+3)//2, max(2,1), min(4,3)-1+2)
    assert torch.equal(out.flatten(), torch.arange(out.numel()))
    assert first.shape == (4, 2)
    assert torch.equal(first, a[:, :1] + b[0][None, :])


@pnex.jit(n_threads="out.numel()")
def every_nth(a: pnex.In("f32", (None,)), n: int, out: pnex.Out("f32", ("a.numel() // n",))):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i * n]


def test_division_by_zero_at_call_time():
    a = torch.arange(7, dtype=torch.float32)
    assert torch.equal(every_nth(a, 3), torch.tensor([0.0, 3.0]))
    with pytest.raises(ArgumentShapeError, match=r"division by zero while evaluating a.numel\(\) // n \(n = 0\)"):
        every_nth(a, 0)


def test_launch_size_expression_with_max():
    a = torch.zeros(0, 3)
    b = torch.ones(6, 2)
    out, first = shape_zoo(a, b, 0)
    assert out.shape == (0, 1, 1, 1) and first.shape == (0, 2)
