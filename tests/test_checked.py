"""The checked variant of a kernel (:mod:`pnex_magic.checking`), without a GPU.

* the rewrite: which subscripts become checked accesses, their sites (line, text,
  variable, role), the new function's name, parameters, file and lines, closures;
* the CUDA simulator runs the checked function end to end with planted accesses out
  of bounds (1-D, 2-D, 3-D; an ``Out`` write, an ``InMut`` write, an ``In`` read;
  shared and local arrays; atomics; views), and the record and message say where;
  correct kernels give the same results checked and unchecked;
* each kernel shape compiles to PTX and a cubin for sm_90 (NVVM and nvJitLink
  wheels, no GPU), with the checks inlined (no calls) and the record's
  compare-and-swap in the code.

tests/test_checked_gpu.py runs the same kernels on a GPU and compares the records.
"""

from __future__ import annotations

import linecache
import math
import re
import types

import numpy as np
import pytest
import torch
from numba import cuda, float32

import pnex_magic as pnex
from pnex_magic import checking as C
from pnex_magic.errors import KernelDefinitionError, KernelIndexError, PnexError
from toolchain import needs_nvvm, simulable, simulate

RECORD = C.RECORD_SIZE


def run_plain(fn, grid, block, *args):
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    wrapped = [FakeCUDAArray(a) if isinstance(a, np.ndarray) else a for a in args]
    FakeCUDAKernel(simulable(fn), device=False)[grid, block](*wrapped)


# ----------------------------------------------------------------------------- kernels


def copy(a, r):
    i = cuda.grid(1)
    if i < r.shape[0]:
        r[i + 1] = a[i]


def read_past(a, r):
    i = cuda.grid(1)
    if i < r.shape[0]:
        r[i] = a[i + 1]


def inmut_2d(u):
    x, y = cuda.grid(2)
    if y < u.shape[0] and x < u.shape[1]:
        u[x, y] += 1.0  # transposed: out of bounds on a non-square array


def out_3d(a, out):
    x, y, z = cuda.grid(3)
    if z < out.shape[0] and y < out.shape[1] and x < out.shape[2]:
        out[z, y, x + 1] = a[z, y, x]


def in_3d(a, out):
    x, y, z = cuda.grid(3)
    if z < out.shape[0] and y < out.shape[1] and x < out.shape[2]:
        out[z, y, x] = a[z, y + 1, x]


def in_2d(a, out):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[y + 1, x]


TPB = 8


def shared_off_by_one(a, out):
    tile = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = a[i]
    cuda.syncthreads()
    out[i] = tile[t + 1]  # reads past the tile in the last thread


def local_array(a, out):
    i = cuda.grid(1)
    acc = cuda.local.array(4, float32)
    for k in range(4):
        acc[k] = a[i] * k
    out[i] = acc[i % 5]  # index 4 is out of bounds


def atomics(keys, counts, olds):
    i = cuda.grid(1)
    if i < keys.shape[0]:
        cuda.atomic.add(counts, keys[i], 1)
        olds[i] = cuda.atomic.add(counts, keys[i], 0) + 100


def negative(a, out, shift):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i - shift]  # -n <= i - shift < 0 counts from the end; below -n is out of bounds


def views(a, out):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        row = a[y + 1]  # a view: checked on axis 0, clamped to 0
        out[y, x] = row[x]


def tuple_index(a, out):
    x, y = cuda.grid(2)
    idx = (y, x + 1)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[idx]


def chained(a, out):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y][x] = a[y][x + 1]


def not_arrays(a, out):
    i = cuda.grid(1)
    t = (2.0, 3.0)
    mixed = (1, 0.5)
    shape = a.shape
    if i < out.shape[0]:
        out[i] = a[i] * t[i % 2] + mixed[0] + shape[0] + a[0:2][0]


@pnex.jit(n_threads="a.numel()")
def spec_kernel(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i]


def make_scaled(scale):
    def scaled(a, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = a[i] * scale

    return scaled


CALLS = {"n": 0}


def counted(i):
    CALLS["n"] += 1
    return i


def update_once(out):
    i = cuda.grid(1)
    out[counted(i)] += 1.0


def many(a, b, out):
    i = cuda.grid(1)
    out[i], b[i + 1] = a[i], a[i] * 2
    out[i] = b[i] = a[i] + 1


# ----------------------------------------------------------------------------- rewrite


def test_the_checked_function_keeps_name_parameters_file_and_lines():
    ck = C.checked_kernel(copy)
    fn = ck.function
    assert fn.__name__ == "copy" and fn.__qualname__ == copy.__qualname__ and fn.__module__ == copy.__module__
    assert fn.__code__.co_varnames[: fn.__code__.co_argcount] == ("a", "r", C.ERR_PARAM)
    assert fn.__code__.co_filename == copy.__code__.co_filename
    assert fn.__code__.co_firstlineno == copy.__code__.co_firstlineno
    assert fn.__globals__ is not copy.__globals__ and fn.__globals__["cuda"] is cuda  # a copy, same values
    line = copy.__code__.co_firstlineno + 3
    assert ck.sites == (
        C.Site(0, "a", line, "r[i + 1] = a[i]", "load", "parameter"),
        C.Site(1, "r", line, "r[i + 1] = a[i]", "store", "parameter"),
    )


def test_sites_of_each_kind_of_access():
    kinds = {s.kind for s in C.checked_kernel(atomics).sites}
    assert kinds == {"load", "atomic", "store"}
    assert [s.kind for s in C.checked_kernel(inmut_2d).sites] == ["update"]
    roles = {(s.variable, s.role) for s in C.checked_kernel(shared_off_by_one).sites}
    assert ("tile", "shared array") in roles and ("a", "parameter") in roles
    assert {s.role for s in C.checked_kernel(local_array).sites if s.variable == "acc"} == {"local array"}
    assert [s.variable for s in C.checked_kernel(chained).sites] == ["a[y]", "a", "out[y]", "out"]


def test_slices_are_left_to_numba():
    ck = C.checked_kernel(not_arrays)
    # a[0:2] stays as written (its bounds are clipped); the [0] of the slice is checked
    assert [s.variable for s in ck.sites] == ["a", "t", "mixed", "shape", "a[0:2]", "out"]


def test_a_kernel_without_source_is_refused():
    namespace = {"cuda": cuda}
    exec("def gone(a, r):\n    r[0] = a[0]\n", namespace)
    with pytest.raises(KernelDefinitionError, match="checked variant .* source"):
        C.checked_kernel(namespace["gone"])


def test_reserved_names_are_refused():
    def sneaky(a, r):
        __pnex_k0 = 1  # noqa: F841
        r[0] = a[0]

    with pytest.raises(KernelDefinitionError, match="reserved"):
        C.checked_kernel(sneaky)


def test_a_cell_pseudo_file_keeps_the_cells_line_numbers():
    source = "%%pnex --n-threads a.numel()\ndef cell_kernel(a, r):\n    i = cuda.grid(1)\n    r[i] = a[i + 1]\n"
    filename = "<pnex-cell-7-test>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"cuda": cuda}
    exec(compile("\n" + source.split("\n", 1)[1], filename, "exec"), namespace)  # line 1 is the magic line
    ck = C.checked_kernel(namespace["cell_kernel"])
    assert [(s.line, s.source_text) for s in ck.sites] == [(4, "r[i] = a[i + 1]")] * 2
    a, r = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    err = simulate(ck.function, 1, 8, a, r)
    assert "at line 4: `r[i] = a[i + 1]`" in ck.describe(err)


# ----------------------------------------------------------------------------- simulator: violations


def _expect(err, ck, *, site_var, axis, index, shape, thread, block):
    v = C.decode_record(err)
    assert v is not None, "no violation recorded"
    assert ck.sites[v.site].variable == site_var
    assert (v.axis, v.index, v.shape, v.thread, v.block) == (axis, index, shape, thread, block)
    return v


def test_out_write_1d_is_skipped_and_recorded():
    ck = C.checked_kernel(copy)
    a, r = np.arange(64, dtype=np.float32), np.full(64, -1, np.float32)
    err = simulate(ck.function, 2, 32, a, r)
    _expect(err, ck, site_var="r", axis=0, index=64, shape=(64,), thread=(31, 0, 0), block=(1, 0, 0))
    np.testing.assert_array_equal(r[1:], a[:-1])
    assert r[0] == -1
    text = ck.describe(err)
    assert text == (
        f"copy(): index 64 is out of bounds for axis 0 of parameter 'r' (shape (64,)), at line "
        f"{copy.__code__.co_firstlineno + 3}: `r[i + 1] = a[i]`, thread (31, 0, 0) of block (1, 0, 0)"
    )


def test_in_read_1d_gives_zero():
    ck = C.checked_kernel(read_past)
    a, r = np.arange(1, 17, dtype=np.float32), np.full(16, -1, np.float32)
    err = simulate(ck.function, 1, 16, a, r)
    _expect(err, ck, site_var="a", axis=0, index=16, shape=(16,), thread=(15, 0, 0), block=(0, 0, 0))
    assert r[-1] == 0 and (r[:-1] == a[1:]).all()


def test_inmut_2d_transposed_index():
    ck = C.checked_kernel(inmut_2d)
    u = np.zeros((3, 5), np.float32)
    err = simulate(ck.function, (1, 1), (5, 3), u)
    v = C.decode_record(err)
    assert ck.sites[v.site].kind == "update" and v.axis == 0 and v.index >= 3 and v.shape == (3, 5)
    assert u.sum() == 9  # only the 3 x 3 accesses in bounds happened


@pytest.mark.parametrize("kernel, var, axis", [(out_3d, "out", 2), (in_3d, "a", 1)])
def test_3d(kernel, var, axis):
    ck = C.checked_kernel(kernel)
    a, out = np.ones((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.float32)
    err = simulate(ck.function, (1, 1, 1), (4, 3, 2), a, out)
    v = C.decode_record(err)
    assert ck.sites[v.site].variable == var and v.axis == axis and v.rank == 3 and v.shape == (2, 3, 4)
    assert f"axis {axis} of parameter '{var}' (shape (2, 3, 4))" in ck.describe(err)


def test_in_read_2d():
    ck = C.checked_kernel(in_2d)
    a, out = np.ones((4, 6), np.float32), np.full((4, 6), -1, np.float32)
    err = simulate(ck.function, (1, 1), (6, 4), a, out)
    v = C.decode_record(err)
    assert (ck.sites[v.site].variable, v.axis, v.index, v.shape) == ("a", 0, 4, (4, 6))
    assert (out[:3] == 1).all() and (out[3] == 0).all()


def test_shared_array_off_by_one():
    ck = C.checked_kernel(shared_off_by_one)
    a, out = np.arange(TPB, dtype=np.float32), np.zeros(TPB, np.float32)
    err = simulate(ck.function, 1, TPB, a, out)
    v = C.decode_record(err)
    assert (ck.sites[v.site].variable, v.index, v.shape, v.thread) == ("tile", TPB, (TPB,), (TPB - 1, 0, 0))
    assert "of shared array 'tile' (shape (8,))" in ck.describe(err)
    assert out[-1] == 0 and (out[:-1] == a[1:]).all()


def test_local_array():
    ck = C.checked_kernel(local_array)
    a, out = np.ones(8, np.float32), np.zeros(8, np.float32)
    err = simulate(ck.function, 1, 8, a, out)
    v = C.decode_record(err)
    assert (ck.sites[v.site].variable, v.index, v.shape) == ("acc", 4, (4,))
    assert "local array 'acc'" in ck.describe(err)


def test_atomics_out_of_bounds_are_skipped_and_give_zero():
    ck = C.checked_kernel(atomics)
    keys = np.array([0, 1, 1, 5], np.int64)
    counts, olds = np.zeros(3, np.int32), np.zeros(4, np.int32)
    err = simulate(ck.function, 1, 4, keys, counts, olds)
    v = C.decode_record(err)
    assert ck.sites[v.site].kind == "atomic" and v.index == 5 and v.shape == (3,)
    assert counts.tolist() == [1, 2, 0]
    assert olds[3] == 100 and olds[0] == 101


def test_negative_indices_count_from_the_end_as_in_numba():
    ck = C.checked_kernel(negative)
    a, out = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    err = simulate(ck.function, 1, 8, a, out, 8)  # i - 8 in [-8, 0): every one valid
    assert C.decode_record(err) is None
    np.testing.assert_array_equal(out, a)
    err = simulate(ck.function, 1, 8, a, out, 9)  # i = 0 reads a[-9]
    v = C.decode_record(err)
    assert (v.index, v.shape, v.thread) == (-9, (8,), (0, 0, 0))


def test_a_view_is_checked_on_its_axes_and_clamped():
    ck = C.checked_kernel(views)
    a, out = np.arange(12, dtype=np.float32).reshape(3, 4), np.full((3, 4), -1, np.float32)
    err = simulate(ck.function, (1, 1), (4, 3), a, out)
    v = C.decode_record(err)
    assert (ck.sites[v.site].variable, v.axis, v.index, v.rank, v.shape) == ("a", 0, 3, 2, (3, 4))
    np.testing.assert_array_equal(out[:2], a[1:])
    np.testing.assert_array_equal(out[2], a[0])  # clamped to row 0


def test_an_index_tuple_in_a_variable_is_checked():
    ck = C.checked_kernel(tuple_index)
    a, out = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    err = simulate(ck.function, (1, 1), (4, 2), a, out)
    v = C.decode_record(err)
    assert (v.axis, v.index, v.shape) == (1, 4, (2, 4))


def test_chained_subscripts_check_each_level():
    ck = C.checked_kernel(chained)
    a, out = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    err = simulate(ck.function, (1, 1), (4, 2), a, out)
    v = C.decode_record(err)
    assert ck.sites[v.site].variable == "a[y]" and (v.axis, v.index, v.rank, v.shape) == (0, 4, 1, (4,))


def test_aug_assign_evaluates_its_index_once():
    ck = C.checked_kernel(update_once)
    CALLS["n"] = 0
    out = np.zeros(4, np.float32)
    err = simulate(ck.function, 1, 4, out)
    assert CALLS["n"] == 4 and C.decode_record(err) is None and (out == 1).all()


def test_only_the_first_violation_is_recorded():
    ck = C.checked_kernel(copy)
    a, r = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    err = simulate(ck.function, 1, 8, a, r)
    err_again = err.copy()
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    FakeCUDAKernel(ck.function, device=False)[1, 8](FakeCUDAArray(a), FakeCUDAArray(r), FakeCUDAArray(err_again))
    np.testing.assert_array_equal(err, err_again)  # the same record: nothing overwrote it


# ----------------------------------------------------------------------------- simulator: correct kernels


def test_correct_kernels_give_the_same_results_checked_and_unchecked():
    ck = C.checked_kernel(not_arrays)
    a, out1, out2 = np.arange(1, 9, dtype=np.float32), np.zeros(8, np.float32), np.zeros(8, np.float32)
    run_plain(not_arrays, 1, 8, a, out1)
    err = simulate(ck.function, 1, 8, a, out2)
    assert C.decode_record(err) is None
    np.testing.assert_array_equal(out1, out2)

    scaled = make_scaled(3.0)
    ck = C.checked_kernel(scaled)
    out3 = np.zeros(8, np.float32)
    assert C.decode_record(simulate(ck.function, 1, 8, a, out3)) is None
    np.testing.assert_array_equal(out3, a * 3)

    ck = C.checked_kernel(many)
    b, o1, o2 = np.zeros(9, np.float32), np.zeros(8, np.float32), np.zeros(8, np.float32)
    b2 = b.copy()
    run_plain(many, 1, 8, a, b, o1)
    assert C.decode_record(simulate(ck.function, 1, 8, a, b2, o2)) is None
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(b, b2)


def test_the_workloads_kernels_give_the_same_results_checked(monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import workloads as wl

    from pnex_magic.launch.simulator import SimulatorLauncher

    def launch(op, values, grid, block, *, check):
        d = op._pnex
        if not check:
            SimulatorLauncher().launch(d, values, grid, block, torch.device("cpu"))
            return None
        from pnex_magic.compiler import numba_signature
        from pnex_magic.simtyping import typed_kernel

        ck = C.checked_kernel(d.fn)
        err = C.error_buffer()
        spec = C.checked_spec(d.spec)
        typed = typed_kernel(ck.function, numba_signature(spec, "A"), spec.name)  # with Numba's types, as pnex runs it
        stand_in = types.SimpleNamespace(spec=spec, simulated_function=lambda **_: simulable(typed))
        SimulatorLauncher().launch(stand_in, [*values, err], grid, block, torch.device("cpu"))
        return ck.describe(err)

    u = wl.initial_field(40)
    new1, new2 = torch.zeros_like(u), torch.zeros_like(u)
    grid = (math.ceil(40 / wl.TX), math.ceil(10 / wl.TY), 1)
    launch(wl.diffusion_step, [u, new1, 0.25], grid, (wl.TX, wl.TY, 1), check=False)
    assert launch(wl.diffusion_step, [u, new2, 0.25], grid, (wl.TX, wl.TY, 1), check=True) is None
    torch.testing.assert_close(new1, new2, rtol=0, atol=0)

    X, means = wl.kmeans_data(300, "cpu")
    l1, l2 = torch.empty(300, dtype=torch.int64), torch.empty(300, dtype=torch.int64)
    grid = (math.ceil(75 / 256), 1, 1)
    launch(wl.kmeans_assign, [X, means, l1], grid, (256, 1, 1), check=False)
    assert launch(wl.kmeans_assign, [X, means, l2], grid, (256, 1, 1), check=True) is None
    assert torch.equal(l1, l2)


# ----------------------------------------------------------------------------- records and messages


def test_decode_and_describe():
    sites = (C.Site(0, "x", 12, "x[i, j, k, l, m] = 0", "store", "parameter"),)
    record = [1, 0, 4, 9, 5, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6, 0]
    v = C.decode_record(np.array(record, np.int64))
    assert v == C.Violation(site=0, axis=4, index=9, rank=5, shape=(2, 3, 4, 5), thread=(1, 2, 3), block=(4, 5, 6))
    text = C.describe_violation("k", record, sites)
    assert text == (
        "k(): index 9 is out of bounds for axis 4 of parameter 'x' (shape (2, 3, 4, 5, ...)), at line 12: "
        "`x[i, j, k, l, m] = 0`, thread (1, 2, 3) of block (4, 5, 6)"
    )
    assert C.decode_record([0] * RECORD) is None
    assert "unknown access site 3" in C.describe_violation("k", [1, 3] + [0] * 14, sites)
    with pytest.raises(ValueError, match="16 entries"):
        C.decode_record([1, 2, 3])
    err = C.violation_error("k", torch.tensor(record), sites)
    assert isinstance(err, KernelIndexError) and isinstance(err, IndexError) and isinstance(err, PnexError)
    assert err.violation == v and err.site == sites[0] and str(err) == text
    assert C.violation_error("k", [0] * RECORD, sites) is None


def test_checked_spec_appends_the_record():
    from pnex_magic.compiler import abi_layout, numba_signature
    from pnex_magic.spec import TensorParam

    spec = spec_kernel._pnex.spec
    cspec = C.checked_spec(spec)
    last = cspec.params[-1]
    assert isinstance(last, TensorParam) and last.name == C.ERR_PARAM and last.role == "inmut" and last.ndim == 1
    assert cspec.params[:-1] == spec.params and cspec.arguments[:-1] == spec.arguments
    assert abi_layout(cspec)[-1] == [8] * 7
    assert str(numba_signature(cspec)[-1]) == "array(int64, 1d, C)"
    assert C.error_buffer().tolist() == [0] * RECORD


# ----------------------------------------------------------------------------- PTX and cubin


def _signature(fn):
    from numba.cuda import types as t

    f32r = t.Array(t.float32, 1, "C", readonly=True)
    f32 = t.Array(t.float32, 1, "C")
    sigs = {
        "copy": (f32r, f32),
        "inmut_2d": (t.Array(t.float32, 2, "A"),),
        "out_3d": (t.Array(t.float32, 3, "A", readonly=True), t.Array(t.float32, 3, "C")),
        "shared_off_by_one": (f32r, f32),
        "local_array": (f32r, f32),
        "atomics": (t.Array(t.int64, 1, "C", readonly=True), t.Array(t.int32, 1, "C"), t.Array(t.int32, 1, "C")),
        "negative": (f32r, f32, t.int64),
        "views": (t.Array(t.float32, 2, "C", readonly=True), t.Array(t.float32, 2, "C")),
        "tuple_index": (t.Array(t.bfloat16 if hasattr(t, "bfloat16") else t.float16, 2, "C", readonly=True),
                        t.Array(t.float32, 2, "C")),
        "chained": (t.Array(t.float64, 2, "A", readonly=True), t.Array(t.float64, 2, "C")),
        "not_arrays": (f32r, f32),
        "scaled": (f32r, f32),
        "many": (f32r, f32, f32),
    }
    return sigs[fn.__name__] + (t.Array(t.int64, 1, "C"),)


@needs_nvvm
@pytest.mark.parametrize(
    "kernel",
    [copy, inmut_2d, out_3d, shared_off_by_one, local_array, atomics, negative, views, tuple_index, chained,
     not_arrays, make_scaled(2.0), many],
    ids=lambda k: k.__name__,
)
def test_every_kernel_shape_compiles_to_ptx_and_a_cubin(kernel):
    from pnex_magic.numbadriver import target_device
    from pnex_magic.linking import has_external_calls, link_cubin

    ck = C.checked_kernel(kernel)
    with target_device((9, 0)):
        ptx, _ = cuda.compile(ck.function, _signature(kernel), device=False, abi="numba", cc=(9, 0), output="ptx")
    assert "atom.global.cas.b64" in ptx  # the record's compare-and-swap
    called = set(re.findall(r"call\.uni[^;]*?\n\s*([\w$]+),", ptx))
    external = set(re.findall(r"\.extern\s+\.func\s*(?:\([^)]*\))?\s*([\w$]+)", ptx))
    assert called <= external, called - external  # every helper inlined (bfloat16 conversions are linked in)
    if not has_external_calls(ptx):
        cubin, log = link_cubin(ptx, "sm_90", None, kernel.__name__)
        assert cubin[:4] == b"\x7fELF" and "registers" in log


@needs_nvvm
def test_a_write_to_an_in_array_fails_to_type_as_in_the_fast_variant():
    from numba.cuda import types as t

    from pnex_magic.numbadriver import target_device

    ck = C.checked_kernel(copy)
    sig = (t.Array(t.float32, 1, "C"), t.Array(t.float32, 1, "C", readonly=True), t.Array(t.int64, 1, "C"))
    with pytest.raises(Exception, match="(?s)readonly.*|.*setitem"):
        with target_device((9, 0)):
            cuda.compile(ck.function, sig, device=False, abi="numba", cc=(9, 0), output="ptx")


# --------------------------------------------------------------------------- checked launches through the op


def test_check_option_runs_the_checked_variant_in_the_simulator(monkeypatch):
    @pnex.jit(n_threads="a.numel()", threads_per_block=8, check=True)
    def shifted(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i + 1] = a[i]

    assert shifted.definition.options.check
    with pytest.raises(pnex.KernelIndexError, match=r"shifted\(\): index 13 is out of bounds for axis 0 of parameter "
                       r"'r' \(shape \(13,\)\), at line \d+: `r\[i \+ 1\] = a\[i\]`, thread \(4, 0, 0\) of block \(1, 0, 0\)"):
        shifted(torch.randn(13))
    monkeypatch.setenv("PNEX_CHECK", "1")

    @pnex.jit(n_threads="a.numel()", threads_per_block=8)
    def fine(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i] = a[i] * 2

    assert fine.definition.options.check
    a = torch.randn(13)
    torch.testing.assert_close(fine(a), a * 2)


def test_check_needs_the_source_and_says_so_at_definition():
    namespace = {"pnex": pnex, "cuda": cuda}
    exec(  # noqa: S102 -- a kernel without source on purpose
        "def nosrc(a: pnex.In('f32', (None,)), r: pnex.Out('f32', 'a')):\n    r[0] = a[0]\n", namespace
    )
    with pytest.raises(pnex.KernelDefinitionError, match="a checked variant .* is built from the kernel's Python source"):
        pnex.jit(n_threads="a.numel()", check=True)(namespace["nosrc"])


def test_the_simulator_names_the_line_of_an_unchecked_fault():
    @pnex.jit(n_threads="a.numel()", threads_per_block=8)
    def over(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i + 1] = a[i]

    with pytest.raises(pnex.KernelLaunchError, match=r"failed in the CUDA simulator at line \d+: `r\[i \+ 1\] = a\[i\]`"):
        over(torch.randn(13))


def test_checked_kernel_in_jax_names_the_access():
    jax = pytest.importorskip("jax")

    @pnex.jit(n_threads="a.numel()", threads_per_block=8, check=True)
    def jshift(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i + 1] = a[i]

    f = pnex.jax_op(jshift)
    with pytest.raises(Exception, match=r"jshift\(\): index 9 is out of bounds for axis 0 of parameter 'r'"):
        jax.block_until_ready(f(np.ones(9, dtype=np.float32)))


def test_checks_hold_through_torch_ops_and_torch_compile():
    @pnex.jit(n_threads="a.numel()", threads_per_block=8, check=True)
    def cshift(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i + 1] = a[i]

    pattern = r"cshift\(\): index 9 is out of bounds for axis 0 of parameter 'r' \(shape \(9,\)\)"
    with pytest.raises(pnex.KernelIndexError, match=pattern):
        getattr(torch.ops.pnex, cshift.definition.op_name)(torch.randn(9))
    compiled = torch.compile(lambda x: cshift(x) * 2, fullgraph=True)
    with pytest.raises(pnex.KernelIndexError, match=pattern):
        compiled(torch.randn(9))


def test_the_launch_stage_exposes_what_the_magic_calls_for_a_checked_run():
    """The magic's checked --args run forces the checked variant through these (a no-op
    before the C++ launcher is loaded, as on a machine without a GPU)."""
    from pnex_magic.launch import native

    native.force_checked("")
    assert native.last_kernel(0) == "" or isinstance(native.last_kernel(0), str)


def test_the_record_has_one_size_in_every_room():
    """The record's size is written in three places that cannot import each other: the
    checked variant's (checking/record.py), the Python launchers' (launch/checks.py, which
    a compile-cache hit loads without the checking package) and the C++ launcher's."""
    import re as _re

    from pnex_magic.launch import build, checks

    header = (build.CSRC / "launcher.h").read_text()
    (cpp,) = _re.findall(r"constexpr int64_t kRecordSlots = (\d+);", header)
    assert checks.RECORD_SLOTS == C.RECORD_SIZE == int(cpp)
