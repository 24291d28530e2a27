"""The checked variant of a kernel (:mod:`pnex_magic.checking`), without a GPU.

* the rewrite: which subscripts become checked accesses, their sites (line, text,
  variable, role), the new function's name, parameters, file and lines, closures;
* the record and its messages;
* each kernel shape compiles to PTX and a cubin for sm_90 (NVVM and nvJitLink
  wheels, no GPU), with the checks inlined (no calls) and the record's
  compare-and-swap in the code;
* checked launches through the op: ``check=True``, the magic's ``--check``, JAX,
  torch ops and ``torch.compile``; the record has one size in every room.

The simulator's runs of the checked kernels: tests/test_checked_simulator.py.
tests/test_checked_gpu.py runs the same kernels on a GPU and compares the records.
"""

from __future__ import annotations

import linecache
import re

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import checking as C
from pnex_magic.errors import KernelDefinitionError, KernelIndexError, PnexError
from toolchain import needs_nvvm, simulate

from checked_kernels import (
    atomics,
    chained,
    copy,
    inmut_2d,
    local_array,
    make_scaled,
    many,
    negative,
    not_arrays,
    out_3d,
    shared_off_by_one,
    spec_kernel,
    tuple_index,
    views,
)

RECORD = C.RECORD_SIZE


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
