"""End-to-end tests of the compiler core on CPU tensors (numba-cuda's CUDA simulator): the op
in PyTorch (torch.compile, opcheck), redefinition, op names, to_extension and the op object.

Every kernel here is compiled to PTX at definition (no GPU needed) and run by the
simulator; results are compared with plain PyTorch on the same random inputs.
Sizes are small: the simulator runs each CUDA thread as Python code.
"""

import subprocess
import sys

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelDefinitionError

from core_kernels import (
    NBINS,
    add_position,
    copy,
    copy_2d,
    cube_plus_one,
    double_maybe_index,
    fill_double,
    histogram,
    iota,
    laplacian,
    muladd_ref,
    mymuladd_2d,
    mymuladd_2d_marked,
    mymuladd_grid,
    rand,
    scale_and_sum,
    stats3,
)


# --------------------------------------------------------------------------------------
# torch.compile and opcheck.
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(a, b, x):
        r = mymuladd_grid(a, b, 0.5) * 2
        h = histogram(x)
        y = torch.zeros_like(a).flatten()
        fill_double(a.flatten().double(), y.double())  # a mutation on a temporary: traced, harmless
        return r + 1, h.sum()

    compiled = torch.compile(f, fullgraph=True)
    for shape in [(4, 6), (5, 3)]:
        a, b = rand(*shape, seed=23), rand(*shape, seed=24)
        x = torch.randint(0, NBINS, (20,), generator=torch.Generator().manual_seed(25))
        r, hsum = compiled(a, b, x)
        torch.testing.assert_close(r, muladd_ref(a, b, 0.5) * 2 + 1)
        assert hsum.item() == 20


@pytest.mark.slow
def test_torch_compile_fullgraph_inmut():
    torch._dynamo.reset()

    def g(a, y):
        fill_double(a, y)
        return y + 1

    compiled = torch.compile(g, fullgraph=True)
    a = rand(9, dtype=torch.float64, seed=26)
    y = torch.full((9,), float("nan"), dtype=torch.float64)
    out = compiled(a, y)
    assert torch.equal(y, 2 * a)  # the mutation is visible to the caller
    assert torch.equal(out, 2 * a + 1)


def _opcheck(op, args):
    torch.library.opcheck(op, args)


OPCHECK_CASES = {
    "copy": lambda: (copy, (rand(5),)),
    "scalar-float": lambda: (mymuladd_2d, (rand(3, 3), rand(3, 3, seed=1), 0.5)),
    "grid-2d": lambda: (mymuladd_grid, (rand(3, 4), rand(3, 4, seed=1), 0.5)),
    "shared-memory": lambda: (laplacian, (rand(5, 6, dtype=torch.float64),)),
    "init-atomics": lambda: (histogram, (torch.tensor([1, 3, 3, 15]),)),
    "several-outputs": lambda: (stats3, (rand(6, dtype=torch.float64), rand(6, dtype=torch.float64, seed=1))),
    "inmut-no-outputs": lambda: (fill_double, (rand(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64))),
    "inmut-and-output": lambda: (scale_and_sum, (rand(5, dtype=torch.float64), 2.0)),
    "unused": lambda: (double_maybe_index, (rand(5),)),
    "grid-3d": lambda: (add_position, (rand(2, 3, 4),)),
    "int-scalar-shape": lambda: (iota, (3, 2)),
    "device-function": lambda: (cube_plus_one, (rand(4),)),
    "non-contiguous-input": lambda: (copy_2d, (rand(4, 6)[:, ::2],)),
}


@pytest.mark.parametrize("case", list(OPCHECK_CASES))
def test_opcheck(case):
    op, args = OPCHECK_CASES[case]()
    _opcheck(op, args)


# --------------------------------------------------------------------------------------
# Redefinition, to_extension, the op object.
# --------------------------------------------------------------------------------------


_SCALER_FACTOR = 1.0


def make_scaler(factor: float):
    """One definition re-run after its global constant changed (a notebook cell re-run
    after editing a constant): one site, one op name, the new kernel replaces the old.
    (A closure value instead makes one op per value: see
    test_a_kernel_factory_makes_one_op_per_closure_value_and_a_rerun_replaces.)"""
    global _SCALER_FACTOR
    _SCALER_FACTOR = factor

    @pnex.jit(n_threads="a.numel()")
    def scaler(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * _SCALER_FACTOR

    return scaler


def test_redefinition_replaces_the_op():
    a = rand(8, seed=27)
    first = make_scaler(2.0)
    assert torch.equal(first(a), a * 2.0)
    second = make_scaler(3.0)
    assert second._qualname == first._qualname
    assert second.definition.op_name == first.definition.op_name
    assert torch.equal(second(a), a * 3.0)
    registered = getattr(torch.ops.pnex, second.definition.op_name)
    assert torch.equal(registered(a), a * 3.0)
    assert torch.equal(registered.default(a), a * 3.0)


STALE_OP_SCRIPT = """
import torch
from numba import cuda
import pnex_magic as pnex

FACTOR = 0.0

def make(factor):  # a re-run with another global constant: one op name, replaced
    global FACTOR
    FACTOR = factor

    @pnex.jit(n_threads="a.numel()")
    def rescaler(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * FACTOR
    return rescaler

a = torch.ones(3)
ops = [make(float(k)) for k in range(1, 5)]
for op in ops:
    for _ in range(3):
        print("RESULT", op(a).tolist())
"""


# Re-registering a name destroys the old torch.library registration (CustomOpDef uses
# get_library_allowing_overwrite); make_op points every earlier op object of the name at
# the new one, so an old object never calls into freed memory.


def test_replaced_op_object_uses_the_live_registration():
    first = make_scaler(5.0)
    second = make_scaler(6.0)
    assert first._opoverload is second._opoverload


# Not strict: a use-after-free fails only now and then.
@pytest.mark.slow
def test_calling_a_replaced_op_object(tmp_path, pnex_env):
    """A notebook keeps old op objects around (a model holding one, say) after the
    cell is re-run: calling one must not crash.  It runs the latest definition.
    In a subprocess, since the failure mode is a crash."""
    script = tmp_path / "stale_ops.py"
    script.write_text(STALE_OP_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], env=pnex_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-2000:]}"
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert results == ["RESULT [4.0, 4.0, 4.0]"] * 12


def _make_kernel_named_twin(signature: str):
    """Two definitions of one kernel name in one module: same op name."""
    if signature == "one":
        @pnex.jit(n_threads="a.numel()")
        def twin(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] + 1.0
    else:
        @pnex.jit(n_threads="a.numel()")
        def twin(a: pnex.In("f32", (None,)), s: float, out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] * s
    return twin


def test_redefinition_with_another_signature_makes_old_objects_fail_clearly():
    a = rand(6, seed=31)
    old = _make_kernel_named_twin("one")
    assert torch.equal(old(a), a + 1.0)
    new = _make_kernel_named_twin("two")
    assert old._qualname == new._qualname
    assert torch.equal(new(a, 3.0), a * 3.0)
    with pytest.raises(KernelDefinitionError, match=r"(?s)twin\(\): this op object is from an earlier definition, "
                       r"twin\(a: Tensor\[float32, \(None,\)\]\).*redefined at .*test_core_ops.py:\d+ as "
                       r"twin\(a: Tensor\[float32, \(None,\)\], s: float\).*Use the object the new definition"):
        old(a)
    # Re-running the first definition brings the old signature back: the newest object works,
    # and so does `new`'s signature no longer (it is superseded in turn).
    again = _make_kernel_named_twin("one")
    assert torch.equal(again(a), a + 1.0)
    with pytest.raises(KernelDefinitionError, match="redefined"):
        new(a, 3.0)


def test_failed_redefinition_leaves_the_previous_op_registered():
    from pnex_magic.define import definition as make_definition
    from pnex_magic.define import registered

    a = rand(5, seed=32)
    first = make_scaler(2.0)
    retry = make_definition(first.definition.fn, n_threads="a.numel()")  # scale 2 again, later
    four = make_scaler(4.0)
    assert torch.equal(first(a), a * 4.0)  # same signature: earlier objects call the newest kernel
    with pytest.raises(RuntimeError, match="fails inside"):
        with registered(retry) as op:
            assert torch.equal(op(a), a * 2.0) and torch.equal(first(a), a * 2.0)
            raise RuntimeError("fails inside the transaction")
    # The definition registered before the failed block (scale 4) is back, everywhere.
    assert first.definition is four.definition and op.definition is four.definition
    for call in (first, four, op, getattr(torch.ops.pnex, four.definition.op_name)):
        assert torch.equal(call(a), a * 4.0)


def test_op_names_are_deterministic_and_distinct():
    assert copy._qualname == f"pnex::{copy.definition.op_name}"
    assert copy.definition.op_name.startswith("copy_")
    assert mymuladd_2d.definition.op_name != mymuladd_2d_marked.definition.op_name
    assert isinstance(copy, torch.library.CustomOpDef)
    assert isinstance(copy, pnex.PnexOp)
    text = repr(mymuladd_grid)
    assert "mymuladd_grid(a: Tensor[float32, (None, None)]" in text and "c: float" in text


def test_to_extension_op_runs_on_cpu():
    assert mymuladd_grid.definition.options.to_extension is True
    a, b = rand(3, 3), rand(3, 3, seed=1)
    torch.testing.assert_close(mymuladd_grid(a, b, 1.0), muladd_ref(a, b, 1.0))


def test_device_function_call():
    a = rand(50, seed=28)
    torch.testing.assert_close(cube_plus_one(a), a.double().pow(3).add(1).float())


def test_a_kernel_factory_makes_one_op_per_closure_value_and_a_rerun_replaces():
    """``make(2.0)`` and ``make(3.0)`` define the same function at the same place: with
    op names from the site alone, the second silently replaced the first (both ops then
    ran the last kernel).  The closure's values are part of the site."""
    def make(factor):
        @pnex.jit(n_threads="a.numel()")
        def scale(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                r[i] = a[i] * factor

        return scale

    a = torch.randn(40)
    two, three = make(2.0), make(3.0)
    assert two._pnex.op_name != three._pnex.op_name
    torch.testing.assert_close(two(a), a * 2)
    torch.testing.assert_close(three(a), a * 3)
    again = make(2.0)  # a re-run with the same values replaces its op
    assert again._pnex.op_name == two._pnex.op_name
    torch.testing.assert_close(again(a), a * 2)
