"""Every error a user can cause: the exception class, and a message that names the
parameter, expression or argument at fault."""

import ast
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import (
    ArgumentShapeError,
    ArgumentTypeError,
    KernelDefinitionError,
    KernelLaunchError,
    KernelTypingError,
    PnexError,
    ShapeExpressionError,
)
from pnex_magic.launch import launcher_for
from pnex_magic.spec import build_spec

# --------------------------------------------------------------------------------------
# Kernels used by the call-time tests.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads="a.numel()")
def pair_sum(
    a: pnex.In("f32", (None,)),
    b: pnex.In("f32", ("a.size(0)",)),
    out: pnex.Out("f32", "a"),
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] + b[i]


@pnex.jit(n_threads=("m.size(1)", "m.size(0)"))
def fixed_rows(m: pnex.In("f64", (3, None)), n: int, out: pnex.Out("f64", ("n", "m.size(1)"))):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = m[y % 3, x]


@pnex.jit(n_threads="1")
def flagged(x: pnex.InMut("i32", (1,)), on: bool, scale: float):
    if cuda.grid(1) == 0 and on:
        x[0] = x[0] * int(scale)


def raises_named(exc_type, pattern):
    return pytest.raises(exc_type, match=pattern)


# --------------------------------------------------------------------------------------
# Definition errors.
# --------------------------------------------------------------------------------------


def define(fn, **options):
    options.setdefault("n_threads", "a.numel()")
    return pnex.jit(**options)(fn)


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


def _positional(name):
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def test_duplicate_parameter_name():
    def k(a, b):
        pass

    k.__annotations__ = {"a": pnex.In("f32", (None,)), "b": pnex.In("f32", (None,))}
    # A Signature collapses a repeated name into one entry: the mismatch with the
    # function's own parameters is what gives the duplicate away.
    sig = inspect.Signature([_positional("a"), _positional("a")], __validate_parameters__=False)
    with raises_named(
        KernelDefinitionError, r"kernel 'k': the signature given lists parameters \(a\) but the function's are \(a, b\)"
    ):
        build_spec(k, n_threads="a.numel()", signature=sig)

    with raises_named(KernelDefinitionError, r"the signature given lists parameters \(b, a\) but the function's are"):
        build_spec(k, n_threads="a.numel()", signature=inspect.Signature([_positional("b"), _positional("a")]))


def test_annotation_for_missing_parameter():
    def k(a):
        pass

    k.__annotations__ = {"a": pnex.In("f32", (None,)), "ghost": pnex.In("f32", (None,))}
    with raises_named(KernelDefinitionError, r"annotation for 'ghost', which is not a parameter"):
        build_spec(k, n_threads="a.numel()")


def test_bad_annotations():
    def k(a: pnex.In):
        pass

    with raises_named(KernelDefinitionError, r"parameter 'a': In needs a dtype and a shape"):
        define(k)

    def k2(a: list):
        pass

    with raises_named(KernelDefinitionError, r"parameter 'a': <class 'list'> is not a pnex annotation"):
        define(k2)

    def k3(a: "NotDefinedAnywhere('f32', (None,))"):
        pass

    with raises_named(KernelDefinitionError, r"parameter 'a': cannot evaluate the annotation"):
        define(k3)

    def k4(a: pnex.In("f32", (None,))) -> int:
        pass

    with raises_named(KernelDefinitionError, r"kernel 'k4' is annotated to return"):
        define(k4)

    def k5(a: pnex.In("f32", (None,)), *rest: pnex.In("f32", (None,))):
        pass

    with raises_named(KernelDefinitionError, r"parameter 'rest': kernels take plain positional parameters"):
        define(k5)

    def k6(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a", init="zero")):
        pass

    with raises_named(KernelDefinitionError, r"parameter 'out': init must be a number, got 'zero'"):
        define(k6)


@pytest.mark.parametrize(
    "dtype, init, pattern",
    [
        ("i32", 0.5, r"init=0.5 is not an integer, but the tensor's dtype is int32"),
        ("i64", float("nan"), r"init=nan is not an integer"),
        ("i8", 300, r"init=300 does not fit in the tensor's dtype, int8"),
        ("i64", 2**64, r"init=18446744073709551616 does not fit in the tensor's dtype, int64"),
        ("f32", 1e40, r"init=1e\+40 does not fit in the tensor's dtype, float32"),
    ],
)
def test_init_must_fit_the_dtype(dtype, init, pattern):
    def k(a: pnex.In("f32", (None,)), out: pnex.Out(dtype, "a", init=init)):
        pass

    with raises_named(KernelDefinitionError, r"parameter 'out': " + pattern):
        define(k)


def test_init_values_that_fit():
    for dtype, init in [("i32", 2.0), ("f16", float("inf")), ("f32", float("nan")), ("bool", True), ("u8", 255), ("f64", -7)]:
        def k(a: pnex.In("f32", (None,)), out: pnex.Out(dtype, "a", init=init)):
            pass

        spec = build_spec(k, n_threads="a.numel()")
        assert spec.outputs[0].init is init


def test_jit_option_errors():
    def k(a: pnex.In("f32", (None,))):
        pass

    with raises_named(KernelDefinitionError, r"max_registers must be a positive int, got 0"):
        pnex.jit(n_threads="a.numel()", max_registers=0)
    with raises_named(KernelDefinitionError, r"cache_id must be a string, got 3"):
        pnex.jit(n_threads="a.numel()", cache_id=3)
    with raises_named(KernelDefinitionError, r"jit\(\) expects a Python function, got 5"):
        pnex.jit(n_threads="1")(5)
    with raises_named(KernelDefinitionError, r"unknown GPU architecture 'sm_abc'"):
        pnex.jit(n_threads="a.numel()", arch="sm_abc")(k)


def test_n_threads_arity():
    def k(a: pnex.In("f32", (None,))):
        pass

    with raises_named(KernelDefinitionError, r"kernel 'k': n_threads must be one expression or a tuple of 2 or 3.*got 4 entries"):
        define(k, n_threads=("1", "1", "1", "1"))
    with raises_named(KernelDefinitionError, r"got 0 entries"):
        define(k, n_threads=())
    with raises_named(KernelDefinitionError, r"n_threads entries must be positive"):
        define(k, n_threads=0)


def test_threads_per_block_errors():
    def k(a: pnex.In("f32", (None,))):
        pass

    with raises_named(KernelDefinitionError, r"kernel 'k': threads_per_block \(8, 8\) has 2 dimension\(s\) but n_threads has 1"):
        define(k, threads_per_block=(8, 8))
    with raises_named(KernelDefinitionError, r"threads_per_block 64 has 1 dimension\(s\) but n_threads has 2"):
        define(k, n_threads=("a.numel()", "1"), threads_per_block=64)
    for bad in (0, -32, 2.5, True):
        with raises_named(KernelDefinitionError, r"threads_per_block entries must be positive ints"):
            define(k, threads_per_block=bad)
    with raises_named(KernelDefinitionError, r"makes 2048 threads per block; CUDA allows at most 1024"):
        define(k, n_threads=("1", "1"), threads_per_block=(64, 32))
    with raises_named(KernelDefinitionError, r"Z size 128 exceeds CUDA's limit of 64"):
        define(k, n_threads=("1", "1", "1"), threads_per_block=(1, 1, 128))


def test_numba_typing_error():
    def bad_body(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        out[i] = a[i] + "text"

    with raises_named(KernelTypingError, r"kernel 'bad_body' \(line \d+\): Numba could not compile the kernel body.*a: (readonly )?array\(float32, 1d, [AC]\)") as info:
        define(bad_body)
    assert isinstance(info.value, TypeError) and isinstance(info.value, KernelDefinitionError)
    assert "add" in info.value.compiler_log

    def undefined(a: pnex.InMut("f32", (None,))):
        a[0] = not_defined_anywhere  # noqa: F821

    with raises_named(KernelTypingError, r"(?s)kernel 'undefined'.*NameError: name 'not_defined_anywhere' is not defined"):
        define(undefined)

    def wrong_rank(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        out[0, 0] = a[0]

    with raises_named(KernelTypingError, r"(?s)kernel 'wrong_rank'.*cannot index array\(float32, 1d, C\) with 2 indices"):
        define(wrong_rank)


def test_writing_an_in_parameter():
    def writes_input(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            a[i] = b[i]

    with raises_named(KernelTypingError, r"(?s)kernel 'writes_input'.*In parameters \(a, b\) are read-only: declare a parameter InMut"):
        define(writes_input)


def test_unused_parameter_used():
    def k(a: pnex.InMut("f32", (None,)), skipped: pnex.Unused):
        skipped[0] = a[0]

    with raises_named(KernelTypingError, r"(?s)kernel 'k'.*skipped: none"):
        define(k)


# --------------------------------------------------------------------------------------
# Call-time errors.
# --------------------------------------------------------------------------------------


def f32(*shape):
    return torch.zeros(*shape)


def test_wrong_number_of_arguments():
    with raises_named(ArgumentTypeError, r"pair_sum\(\) is missing argument\(s\) 'b'; it takes \(a, b\)"):
        pair_sum(f32(3))
    with raises_named(ArgumentTypeError, r"pair_sum\(\) is missing argument\(s\) 'a', 'b'"):
        pair_sum()
    with raises_named(ArgumentTypeError, r"pair_sum\(\) takes 2 argument\(s\) \(a, b\) but 4 were given$"):
        pair_sum(f32(3), f32(3), f32(3), f32(3))


def test_out_passed_positionally():
    with raises_named(
        ArgumentTypeError,
        r"pair_sum\(\) takes 2 argument\(s\) \(a, b\) but 3 were given; Out parameters \(out\) are returned",
    ):
        pair_sum(f32(3), f32(3), f32(3))


def test_out_passed_as_keyword():
    with raises_named(ArgumentTypeError, r"pair_sum\(\): 'out' is an Out parameter: the op creates and returns it"):
        pair_sum(f32(3), f32(3), out=f32(3))


def test_bad_keywords():
    with raises_named(ArgumentTypeError, r"unexpected keyword argument 'c'; its arguments are \(a, b\)"):
        pair_sum(f32(3), f32(3), c=f32(3))
    with raises_named(ArgumentTypeError, r"pair_sum\(\) got multiple values for argument 'a'"):
        pair_sum(f32(3), f32(3), a=f32(3))


def test_multiple_values_reported_before_missing():
    with raises_named(ArgumentTypeError, r"pair_sum\(\) got multiple values for argument 'a'"):
        pair_sum(f32(3), a=f32(3))


def test_wrong_dtype():
    with raises_named(ArgumentTypeError, r"pair_sum\(\): argument 'b' must be a float32 tensor, got float64"):
        pair_sum(f32(3), torch.zeros(3, dtype=torch.float64))
    with raises_named(ArgumentTypeError, r"argument 'x' must be a int32 tensor, got int64"):
        flagged(torch.zeros(1, dtype=torch.int64), True, 1.0)


def test_wrong_number_of_dimensions():
    with raises_named(ArgumentShapeError, r"pair_sum\(\): argument 'a' must have 1 dimension\(s\) \(None,\), got 2 with shape \(3, 1\)"):
        pair_sum(f32(3, 1), f32(3))
    with raises_named(ArgumentShapeError, r"argument 'm' must have 2 dimension\(s\)"):
        fixed_rows(torch.zeros(3, dtype=torch.float64), 2)


def test_fixed_size_mismatch():
    with raises_named(ArgumentShapeError, r"fixed_rows\(\): argument 'm' must have size 3 = 3 on axis 0, got 4 \(shape \(4, 2\)\)"):
        fixed_rows(torch.zeros(4, 2, dtype=torch.float64), 2)
    with raises_named(ArgumentShapeError, r"argument 'x' must have size 1 = 1 on axis 0, got 2"):
        flagged(torch.zeros(2, dtype=torch.int32), True, 1.0)


def test_expression_size_mismatch():
    with raises_named(ArgumentShapeError, r"pair_sum\(\): argument 'b' must have size a.size\(0\) = 3 on axis 0, got 4"):
        pair_sum(f32(3), f32(4))


def test_negative_output_size():
    with raises_named(ArgumentShapeError, r"fixed_rows\(\): output 'out' would have size n = -1 on axis 0"):
        fixed_rows(torch.zeros(3, 2, dtype=torch.float64), -1)


def test_tensors_on_different_devices():
    with raises_named(ArgumentTypeError, r"pair_sum\(\): argument 'b' is on meta but 'a' is on cpu; all tensor arguments must be on one device"):
        pair_sum(f32(3), torch.zeros(3, device="meta"))
    with raises_named(ArgumentTypeError, r"argument 'b' is on cpu but 'a' is on meta"):
        pair_sum(torch.zeros(3, device="meta"), f32(3))


def test_meta_tensors_only_run_shape_logic():
    out = pair_sum(torch.zeros(5, device="meta"), torch.zeros(5, device="meta"))
    assert out.device.type == "meta" and out.shape == (5,)


def test_non_tensor_argument():
    with raises_named(ArgumentTypeError, r"pair_sum\(\): argument 'a' must be a torch.Tensor \(In\(float32, \(None,\)\)\), got list"):
        pair_sum([1.0, 2.0], f32(2))
    with raises_named(ArgumentTypeError, r"argument 'b' must be a torch.Tensor.*got ndarray"):
        pair_sum(f32(2), f32(2).numpy())


def test_none_for_tensor_argument():
    with raises_named(ArgumentTypeError, r"argument 'b' must be a torch.Tensor.*got NoneType"):
        pair_sum(f32(2), None)


def test_scalar_argument_types():
    m = torch.zeros(3, 2, dtype=torch.float64)
    with raises_named(ArgumentTypeError, r"fixed_rows\(\): argument 'n' must be a Python int \(Scalar\(int64\)\), got float 2.0"):
        fixed_rows(m, 2.0)
    with raises_named(ArgumentTypeError, r"argument 'n' must be a Python int.*got NoneType None"):
        fixed_rows(m, None)
    x = torch.ones(1, dtype=torch.int32)
    with raises_named(ArgumentTypeError, r"flagged\(\): argument 'scale' must be a Python float \(Scalar\(float32\)\), got str"):
        flagged(x, True, "2")
    flagged(x, True, 3)  # an int is a fine float
    assert x.tolist() == [3]


def test_scalar_bool_and_int_are_not_interchangeable():
    m = torch.zeros(3, 2, dtype=torch.float64)
    x = torch.ones(1, dtype=torch.int32)
    with raises_named(ArgumentTypeError, r"argument 'n' must be a Python int.*got bool True"):
        fixed_rows(m, True)
    with raises_named(ArgumentTypeError, r"flagged\(\): argument 'on' must be a Python bool \(Scalar\(bool\)\), got int 1"):
        flagged(x, 1, 1.0)
    with raises_named(ArgumentTypeError, r"argument 'scale' must be a Python float.*got bool"):
        flagged(x, True, False)


def test_unknown_device_has_no_launcher():
    with raises_named(KernelLaunchError, r"no pnex back end runs kernels on 'xpu' tensors"):
        launcher_for(torch.device("xpu"))
    with raises_named(KernelLaunchError, r"'hpu'"):
        launcher_for(torch.device("hpu"))


def test_inspect_rejects_other_objects():
    with raises_named(KernelDefinitionError, r"pnex.inspect\(\) expects an op made by pnex.jit"):
        pnex.inspect(torch.add)


def test_kernel_fault_in_simulator():
    @pnex.jit(n_threads="a.numel()")
    def overrun(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i + 1] = a[i]

    with raises_named(KernelLaunchError, r"kernel 'overrun' failed in the CUDA simulator at line \d+: `out\[i \+ 1\] = a\[i\]`: IndexError"):
        overrun(f32(4))


# --------------------------------------------------------------------------------------
# The error classes themselves.
# --------------------------------------------------------------------------------------


def test_error_hierarchy():
    assert issubclass(KernelDefinitionError, TypeError)
    assert issubclass(KernelTypingError, KernelDefinitionError)
    assert issubclass(ShapeExpressionError, ValueError)
    assert issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ArgumentShapeError, ValueError)
    assert issubclass(KernelLaunchError, RuntimeError)
    for cls in (
        KernelDefinitionError,
        ShapeExpressionError,
        KernelTypingError,
        pnex.KernelCompileError,
        ArgumentTypeError,
        ArgumentShapeError,
        KernelLaunchError,
    ):
        assert issubclass(cls, PnexError)
        assert not issubclass(cls, AssertionError)


def test_package_has_no_assert_statements():
    """Checks must survive ``python -O``: no ``assert`` validates anything."""
    root = Path(pnex.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assert):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []


OPTIMIZED_SCRIPT = """
import sys
import torch
from numba import cuda
import pnex_magic as pnex

assert False, "this assert must be stripped"  # proves -O is in effect
print("optimize", sys.flags.optimize)

def k(a: pnex.In("f32", (None,)), b):
    pass

try:
    pnex.jit(n_threads="a.numel()")(k)
except Exception as exc:
    print("definition", type(exc).__name__, exc)

@pnex.jit(n_threads="a.numel()")
def ok(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i]

for args in [(torch.zeros(3, dtype=torch.float64),), (torch.zeros(3, 1),), ()]:
    try:
        ok(*args)
    except Exception as exc:
        print("call", type(exc).__name__, exc)
print("result", ok(torch.arange(3.0)).tolist())
"""


@pytest.mark.slow
def test_errors_under_python_O(tmp_path, pnex_env):
    script = tmp_path / "optimized.py"
    script.write_text(textwrap.dedent(OPTIMIZED_SCRIPT))
    proc = subprocess.run(
        [sys.executable, "-O", str(script)], env=pnex_env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "optimize 1" in lines
    assert any(ln.startswith("definition KernelDefinitionError kernel 'k', parameter 'b' has no annotation") for ln in lines)
    calls = [ln for ln in lines if ln.startswith("call ")]
    assert [c.split()[1] for c in calls] == ["ArgumentTypeError", "ArgumentShapeError", "ArgumentTypeError"]
    assert "must be a float32 tensor, got float64" in calls[0]
    assert "result [0.0, 1.0, 2.0]" in lines
