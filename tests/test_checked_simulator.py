"""The checked variant of a kernel (:mod:`pnex_magic.checking`) in the CUDA simulator, without
a GPU: it runs the checked function end to end with planted accesses out of bounds (1-D, 2-D,
3-D; an ``Out`` write, an ``InMut`` write, an ``In`` read; shared and local arrays; atomics;
views), and the record and message say where; correct kernels (and the workloads' kernels) give
the same results checked and unchecked.

tests/test_checked_gpu.py runs the same kernels on a GPU and compares the records.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from pnex_magic import checking as C
from toolchain import simulable, simulate

from checked_kernels import (
    CALLS,
    TPB,
    atomics,
    chained,
    copy,
    in_2d,
    in_3d,
    inmut_2d,
    local_array,
    make_scaled,
    many,
    negative,
    not_arrays,
    out_3d,
    read_past,
    run_plain,
    shared_off_by_one,
    tuple_index,
    update_once,
    views,
)


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
