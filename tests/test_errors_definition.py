"""Every error a user can cause: the exception class, and a message that names the
parameter, expression or argument at fault.  This file: definition errors in
parameters and annotations, ``init`` values, ``jit`` options, ``threads_per_block``, Numba typing,
writes to an ``In`` parameter and uses of an ``Unused`` one.
"""

import inspect

import pytest
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelDefinitionError, KernelTypingError
from pnex_magic.spec import build_spec

from error_helpers import define, raises_named


# --------------------------------------------------------------------------------------
# Definition errors.
# --------------------------------------------------------------------------------------


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
