"""Every error a user can cause: the exception class, and a message that names the
parameter, expression or argument at fault.  This file: errors at call time
(arguments, dtypes, shapes, devices, scalars, a kernel fault in the simulator), the error classes
themselves, and the checks under ``python -O``.
"""

import ast
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

from error_helpers import raises_named


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
