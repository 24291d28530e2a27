"""Every error a user can cause: the exception class, and a message that names the
parameter, expression or argument at fault.  This file: definition errors in
annotations, dtypes, shape expressions, ``n_threads`` and shape entries.
"""

import pytest
import torch

import pnex_magic as pnex
from pnex_magic import KernelDefinitionError, ShapeExpressionError
from pnex_magic.spec import build_spec

from error_helpers import define, raises_named


# --------------------------------------------------------------------------------------
# Definition errors.
# --------------------------------------------------------------------------------------


def test_parameter_without_annotation():
    def k(a: pnex.In("f32", (None,)), b):
        pass

    with raises_named(KernelDefinitionError, r"kernel 'k', parameter 'b' has no annotation"):
        define(k)


def test_unknown_dtype():
    def k(a: pnex.In("f33", (None,))):
        pass

    with raises_named(KernelDefinitionError, r"parameter 'a': unknown dtype 'f33'; expected one of float16"):
        define(k)

    def k2(a: pnex.In("f32", (None,)), c: pnex.Scalar(torch.complex64)):
        pass

    with raises_named(KernelDefinitionError, r"parameter 'c': unknown dtype torch.complex64"):
        define(k2)


def test_shape_names_unknown_parameter():
    def k(a: pnex.In("f32", (None,)), out: pnex.Out("f32", ("zz.size(0)",))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'out', shape\[0\]: unknown name 'zz'.*'zz.size\(0\)'"):
        define(k)


def test_shape_may_name_a_parameter_declared_later():
    """The docs' ufunc-style kernels put the output first (issue 26, case 6)."""

    def k(r: pnex.Out("f32", "x"), a: pnex.In("f32", ("n", "b.size(0)")), b: pnex.In("f32", "x"),
          x: pnex.In("f32", (None,)), n: int):
        pass

    spec = build_spec(k, n_threads="r.numel()")
    assert [str(e) for e in spec.param("r").shape] == ["x.size(0)"]
    assert [str(e) for e in spec.param("a").shape] == ["n", "b.size(0)"]
    assert spec.param("b").ndim == 1


def test_shape_names_unknown_cyclic_and_output_references_clearly():
    def unknown(r: pnex.Out("f32", "b"), a: pnex.In("f32", (None,))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'r': shape 'b'.*'b' is not a tensor parameter \(tensor parameters: r, a\)"):
        define(unknown)

    def unknown_in_expression(a: pnex.In("f32", ("m.size(0)",)), r: pnex.Out("f32", "a")):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'a', shape\[0\]: unknown name 'm'"):
        define(unknown_in_expression)

    def cycle(a: pnex.In("f32", "b"), b: pnex.In("f32", "c"), c: pnex.In("f32", "a"), r: pnex.Out("f32", "a")):
        pass

    with raises_named(ShapeExpressionError, r"shapes name each other in a cycle \(a -> b -> c -> a\)"):
        define(cycle)

    def itself(r: pnex.Out("f32", "r"), a: pnex.In("f32", (None,))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'r'.*cycle \(r -> r\)"):
        define(itself)

    def input_from_output(a: pnex.In("f32", ("r.size(0)",)), r: pnex.Out("f32", (4,))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'a', shape\[0\]: 'r.size\(0\)' names 'r', an Out tensor, but an input"):
        define(input_from_output)

    def later_output(r: pnex.Out("f32", "s"), s: pnex.Out("f32", "a"), a: pnex.In("f32", (None,))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'r': shape 's' names 's', an Out tensor declared after 'r'"):
        define(later_output)


def test_shape_same_as_scalar():
    def k(n: int, a: pnex.In("f32", "n")):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'a': shape 'n'.*'n' is a scalar"):
        define(k)


MALFORMED = [
    ("a.size(", r"'a.size\(' is not a valid expression"),
    ("a.size(0) ** 2", r"operator 'a.size\(0\) \*\* 2' is not allowed"),
    ("a.size(0) / 2", r"operator 'a.size\(0\) / 2' is not allowed"),
    ("a.size(0) * 1.5", r"only integer constants are allowed, got 1.5"),
    ("'3'", r"only integer constants are allowed, got '3'"),
    ("True", r"only integer constants are allowed, got True"),
    ("a.stride(0)", r"call 'a.stride\(0\)' is not allowed"),
    ("abs(a.size(0))", r"call 'abs\(a.size\(0\)\)' is not allowed"),
    ("a.size(2)", r"axis 2 is out of range for 'a', which has 2 dimension\(s\)"),
    ("a.shape[-3]", r"axis -3 is out of range for 'a'"),
    ("a.size(n)", r"the axis of 'a' must be an integer literal, got 'n'"),
    ("a.size()", r"a.size\(\) needs exactly one axis"),
    ("a.numel(0)", r"a.numel\(\) takes no arguments"),
    ("a.shape[0:1]", r"the axis of 'a' must be an integer literal"),
    ("a[0]", r"'a\[0\]': only tensor.shape\[i\] may be indexed"),
    ("min(a.size(0))", r"min\(\) needs at least two arguments"),
    ("max(a.size(0), key=1)", r"keyword arguments are not allowed"),
    ("len(a, a)", r"len\(\) takes one tensor"),
    ("n.size(0)", r"'n' is a scalar, not a tensor"),
    ("c * 2", r"scalar 'c' is not an integer"),
    ("a.size(0) if n else 1", r"'a.size\(0\) if n else 1' is not allowed in a size expression"),
    ("not n", r"unary operator in 'not n' is not allowed"),
    ("a.T.size(0)", r"expected a tensor parameter's name, got 'a.T'"),
]


@pytest.mark.parametrize("expression, pattern", MALFORMED, ids=[e for e, _ in MALFORMED])
def test_malformed_shape_expression(expression, pattern):
    def k(a: pnex.In("f32", (None, None)), n: int, c: float, out: pnex.Out("f32", (expression,))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'out', shape\[0\]: " + pattern):
        define(k)


def test_malformed_n_threads():
    def k(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        pass

    with raises_named(ShapeExpressionError, r"n_threads\[0\]: operator 'a.numel\(\) \*\* 2' is not allowed"):
        define(k, n_threads="a.numel() ** 2")
    with raises_named(ShapeExpressionError, r"n_threads\[1\]: unknown name 'b'"):
        define(k, n_threads=("a.numel()", "b.numel()"))
    with raises_named(ShapeExpressionError, r"n_threads\[0\]: a bare tensor name \('a'\) only means a size"):
        define(k, n_threads="a")
    with raises_named(ShapeExpressionError, r"n_threads\[0\]: expected an int or an expression string, got 2.5"):
        define(k, n_threads=2.5)


def test_bad_shape_entries():
    def k(a: pnex.In("f32", (None, True))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'a', shape\[1\]: expected an int or an expression string, got True"):
        define(k)

    def k2(a: pnex.In("f32", (None, -2))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'a', shape\[1\]: a size cannot be negative, got -2"):
        define(k2)

    def k3(a: pnex.In("f32", 2.5)):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'a': shape must be a tuple"):
        define(k3)

    def k4(a: pnex.In("f32", ("a.size(0)",))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'a', shape\[0\]: unknown name 'a'"):
        define(k4)

    def k5(a: pnex.In("f32", (None,)), out: pnex.Out("f32", ("a",  "a"))):
        pass

    with raises_named(ShapeExpressionError, r"'a' stands for its size on axis 1, but it has 1 dimension"):
        define(k5)


def test_out_with_none_axis():
    def k(a: pnex.In("f32", (None,)), out: pnex.Out("f32", (None,))):
        pass

    with raises_named(ShapeExpressionError, r"parameter 'out', shape\[0\]: an Out tensor needs a known size on every axis"):
        define(k)
