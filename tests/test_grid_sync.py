"""Grid-wide sync (``cuda.cg.this_grid().sync()``, issue 26 case 4).

On CPU tensors the simulator runs such a kernel with every block at once (numba's own
simulator runs blocks one by one and would skip the sync between them), and says
clearly when the GPU would hang.  Without a GPU, the compile stage links CUDA's device
runtime, records that the kernel needs a cooperative launch (compiled kernel, cache
entry, saved artifact) and keeps NUL bytes out of link errors.  The ``gpu`` tests launch
cooperatively through both GPU launchers, refuse a grid that cannot be resident, and
capture a cooperative launch in a CUDA graph."""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import linking
from pnex_magic.errors import KernelCompileError, KernelIndexError, KernelLaunchError
from pnex_magic.launch import cooperative, grid_simulator, native

from toolchain import needs_nvvm


def _rotate(block=4, check=False):
    """Every element takes its right neighbour's value, ``steps`` times: each step reads what
    another block's thread held before the grid sync and writes after the next one.  Threads
    past the end return before the loop (every block keeps its thread 0)."""

    @pnex.jit(n_threads="x.size(0) + extra", threads_per_block=block, check=check)
    def rotate(x: pnex.InMut("i64", (None,)), steps: int, extra: int):
        i = cuda.grid(1)
        if i >= x.shape[0]:
            return
        g = cuda.cg.this_grid()
        for _ in range(steps):
            v = x[(i + 1) % x.shape[0]]
            g.sync()
            x[i] = v
            g.sync()

    return rotate


def _shifted(block=4):
    """A grid-synchronising kernel that writes one element past the end."""

    @pnex.jit(n_threads="x.size(0)", threads_per_block=block, check=True)
    def shifted(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        cuda.cg.this_grid().sync()
        x[i + 1] = 1.0

    return shifted


def _docs_cg():
    """numba-cuda's doc example (test_cg.py), as ported in examples/numba_docs/cg.py."""
    examples = str(Path(__file__).resolve().parents[1] / "examples" / "numba_docs")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    from _harness import load

    return load("cg")


# ---------------------------------------------------------------------------- the simulator


def test_the_simulator_syncs_the_whole_grid_and_returned_threads_do_not_block_it():
    op = _rotate(block=4)
    x = torch.randint(-1000, 1000, (14,))  # 4 blocks of 4: the last block's 2 extra threads return at once
    expected = torch.roll(x, -5)
    op(x, 5, 2)
    assert torch.equal(x, expected)


def test_numbas_own_simulator_would_not_which_is_why_pnex_runs_every_block_at_once():
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    op = _rotate(block=4)
    x = np.arange(16, dtype=np.int64)
    FakeCUDAKernel(op.definition.simulated_function(), device=False)[4, 4](FakeCUDAArray(x), 3, 0)
    assert not np.array_equal(x, np.roll(np.arange(16), -3))  # blocks one by one: stale neighbours
    assert grid_simulator.uses_grid_sync(op.definition.simulated_function())


def test_shared_memory_is_per_block_while_every_block_runs():
    from numba import float64

    @pnex.jit(n_threads="x.size(0)", threads_per_block=8)
    def block_sums(x: pnex.In("f64", (None,)), partial: pnex.Out("f64", ("x.size(0) // 8",)),
                   total: pnex.Out("f64", (1,))):
        tile = cuda.shared.array(8, float64)
        t = cuda.threadIdx.x
        tile[t] = x[cuda.grid(1)]
        cuda.syncthreads()
        if t == 0:
            s = 0.0
            for j in range(8):
                s += tile[j]
            partial[cuda.blockIdx.x] = s
        cuda.cg.this_grid().sync()
        if cuda.grid(1) == 0:
            s = 0.0
            for j in range(partial.shape[0]):
                s += partial[j]
            total[0] = s

    x = torch.randn(64, dtype=torch.float64)
    partial, total = block_sums(x)
    torch.testing.assert_close(partial, x.view(8, 8).sum(1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(total, x.sum().view(1), rtol=1e-12, atol=1e-12)


def test_a_block_whose_first_thread_returned_is_a_hang_on_the_gpu_and_an_error_here():
    @pnex.jit(n_threads="x.size(0)", threads_per_block=4)
    def first_thread_leaves(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 2:
            return
        x[i] += 1.0
        cuda.cg.this_grid().sync()

    with pytest.raises(KernelLaunchError, match=r"block\(s\) \(2, 0, 0\), whose thread \(0, 0, 0\) has returned.*hang"):
        first_thread_leaves(torch.zeros(16))


def test_one_block_whose_first_thread_returned_is_fine_as_on_the_gpu():
    @pnex.jit(n_threads="x.size(0)", threads_per_block=8)
    def boundary_threads_sync(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        if i % 2 == 0:
            return
        x[i] = 1.0
        cuda.cg.this_grid().sync()
        x[i - 1] = x[i] + 1.0

    x = torch.zeros(8)
    boundary_threads_sync(x)
    assert x.tolist() == [2.0, 1.0] * 4


def test_threads_of_a_block_at_different_barriers_is_an_error_not_a_hang():
    @pnex.jit(n_threads="x.size(0)", threads_per_block=4)
    def mixed_barriers(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        if cuda.threadIdx.x == 1:
            cuda.syncthreads()
        else:
            cuda.cg.this_grid().sync()
        x[i] = 1.0

    with pytest.raises(KernelLaunchError, match=r"(?s)every thread of its grid .*thread 1 of block \(0, 0, 0\) waits "
                                                r"at cuda\.syncthreads\(\) on line \d+.*threads 0, 2-3 of block "
                                                r"\(1, 0, 0\) wait at cuda\.cg\.this_grid\(\)\.sync\(\)"):
        mixed_barriers(torch.zeros(8))


def test_too_many_threads_for_the_simulator_is_a_clear_error():
    op = _rotate(block=64)
    n = grid_simulator.MAX_THREADS + 64
    with pytest.raises(KernelLaunchError, match=rf"this launch has {n} .*more than the {grid_simulator.MAX_THREADS}"):
        op(torch.zeros(n, dtype=torch.int64), 1, 0)


def test_an_exception_in_one_thread_is_reported_with_its_line():
    @pnex.jit(n_threads="x.size(0)", threads_per_block=4)
    def reads_past_the_end(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        cuda.cg.this_grid().sync()
        x[i] = x[i + 1]

    with pytest.raises(KernelLaunchError, match=r"x\[i\] = x\[i \+ 1\]"):
        reads_past_the_end(torch.zeros(8))


def test_the_checked_variant_syncs_the_grid_and_names_an_access_out_of_bounds():
    op = _rotate(block=4, check=True)
    x = torch.arange(8)
    op(x, 3, 0)
    assert torch.equal(x, torch.roll(torch.arange(8), -3))
    with pytest.raises(KernelIndexError, match=r"index 8 is out of bounds for axis 0 of parameter 'x'"):
        _shifted(block=4)(torch.zeros(8))


def test_which_simulated_kernels_sync_the_grid():
    from numba.cuda.cg import this_grid

    @cuda.jit(device=True)
    def helper():
        cuda.cg.this_grid().sync()

    def direct(x):
        this_grid().sync()

    def through_a_device_function(x):
        helper()

    def plain(x):
        cuda.syncthreads()

    assert grid_simulator.uses_grid_sync(direct)
    assert grid_simulator.uses_grid_sync(through_a_device_function)
    assert not grid_simulator.uses_grid_sync(plain)


# ---------------------------------------------------------------------------- compile and link


@needs_nvvm
def test_a_grid_sync_kernel_links_the_device_runtime_and_is_cooperative(fresh_cache):
    op = _rotate()
    compiled = op.definition.compiled()
    assert compiled.cubin is not None and compiled.cooperative and op.definition.cooperative
    assert linking.uses_grid_sync(compiled.ptx) and not linking.has_external_calls(compiled.ptx)
    checked = op.definition.compiled(checked=True)
    assert checked.cubin is not None and checked.cooperative
    meta = [json.loads(p.read_text()) for p in fresh_cache.rglob("meta.json")]
    assert meta and all(m["cooperative"] for m in meta)
    # A new definition of the same kernel is a cache hit that still says so.
    again = _rotate().definition.compiled()
    assert again.cache_hit and again.cooperative
    plain = _plain_copy().definition
    assert not plain.compiled().cooperative and not plain.cooperative


def _plain_copy():
    @pnex.jit(n_threads="x.size(0)")
    def plain_copy(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i]

    return plain_copy


@needs_nvvm
def test_the_launchers_are_told_to_launch_it_cooperatively():
    assert native.launcher_spec(_rotate().definition)["cooperative"] is True
    assert native.launcher_spec(_plain_copy().definition)["cooperative"] is False


@needs_nvvm
def test_a_saved_artifact_keeps_the_flag_and_links_every_architecture(tmp_path):
    op = _rotate()
    path = pnex.save(op, tmp_path / "rotate.pnex", archs=("sm_75", "sm_90"))
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        assert manifest["ops"][0]["cooperative"] is True
        assert {n.rsplit("/", 1)[-1] for n in z.namelist() if n.endswith(".cubin")} == {"sm_75.cubin", "sm_90.cubin"}
    from pnex_magic.artifact.archive import read_archive
    from pnex_magic.artifact.manifest import read_op_entry

    manifest, files = read_archive(path)
    entry = read_op_entry(manifest["ops"][0], files, str(path))
    assert entry.cooperative
    # A manifest that lost the flag is still read as cooperative: its PTX says so.
    del manifest["ops"][0]["cooperative"]
    assert read_op_entry(manifest["ops"][0], files, str(path)).cooperative


_UNDEFINED_CALL_PTX = """.version 7.0
.target sm_75
.address_size 64
.extern .func pnex_nowhere();
.visible .entry calls_nowhere()
{
\tcall.uni pnex_nowhere, ();
\tret;
}
"""


@needs_nvvm
def test_link_errors_carry_no_nul_bytes():
    with pytest.raises(KernelCompileError) as info:
        linking.link_cubin(_UNDEFINED_CALL_PTX, "sm_75", None, "calls_nowhere")
    message = str(info.value)
    assert "Undefined reference to 'pnex_nowhere'" in message
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", message)
    assert "\x00" not in info.value.compiler_log


@needs_nvvm
def test_the_device_runtime_matches_nvjitlink_and_its_absence_is_a_clear_error(monkeypatch):
    from cuda.bindings import nvjitlink

    data, where = linking.device_runtime()
    assert data.startswith(b"!<arch>") and where.endswith("libcudadevrt.a")
    assert {12: "cuda_runtime", 13: "cu13"}[nvjitlink.version()[0]] in where
    linking.device_runtime.cache_clear()
    monkeypatch.setattr(linking.sys, "path", [])
    import cuda.pathfinder

    def nowhere(name):
        raise RuntimeError(f'Failure finding "lib{name}.a"')

    monkeypatch.setattr(cuda.pathfinder, "find_static_lib", nowhere)
    try:
        with pytest.raises(KernelCompileError, match=r"libcudadevrt\.a, which was not found.*pnex_magic\[cu13\]"):
            linking.device_runtime()
    finally:
        linking.device_runtime.cache_clear()


def test_the_coresidency_message_names_the_limit_and_the_fix():
    assert cooperative.problem("k", (264, 1, 1), (256, 1, 1), 2, 132) is None
    text = cooperative.problem("k", (265, 1, 1), (256, 1, 1), 2, 132)
    assert "265 blocks of 256 threads" in text and "2 such blocks per SM x 132 SMs = 264" in text
    assert "grid-stride loop" in text


def test_autotune_skips_candidates_whose_grid_cannot_be_resident():
    # sm_90: 2048 threads per SM; 32 registers per thread keep every block size at 2048 threads per SM.
    fits = cooperative.candidate_problem("k", "sm_90", 32, 0, (256,), (132 * 2048,), 132)
    assert fits is None
    over = cooperative.candidate_problem("k", "sm_90", 32, 0, (256,), (132 * 2048 + 1,), 132)
    assert over is not None and "1057 blocks of 256 threads" in over and "8 such blocks per SM x 132 SMs = 1056" in over


# ---------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_cooperative_launch_on_the_gpu_matches_the_reference(gpu_cache, launcher):
    cg = _docs_cg()  # the docs' launch: 32 blocks of one warp over 1024 x 1024
    results, references = cg.run("cuda", 26)
    assert torch.equal(results["M"].cpu().long(), references["M"])
    x = torch.randint(-(2**40), 2**40, (100_003,), device="cuda")
    expected = torch.roll(x, -7)
    _rotate(block=128)(x, 7, 61)
    assert torch.equal(x, expected)


@pytest.mark.gpu
def test_a_grid_that_cannot_be_resident_is_refused_and_the_context_survives(gpu_cache, launcher):
    op = _rotate(block=1024)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = 1024 * (2 * sms + 1)  # at most 2 blocks of 1024 threads per SM on any GPU pnex supports
    with pytest.raises(KernelLaunchError, match=r"synchronises its grid.*blocks of 1024 threads.*per SM x "
                                                rf"{sms} SMs.*grid-stride loop"):
        op(torch.zeros(n, dtype=torch.int64, device="cuda"), 1, 0)
    x = torch.arange(64, device="cuda")
    _rotate(block=32)(x, 1, 0)
    assert torch.equal(x.cpu(), torch.roll(torch.arange(64), -1))


@pytest.mark.gpu
def test_a_cooperative_launch_is_captured_in_a_cuda_graph(gpu_cache, launcher):
    op = _rotate(block=64)
    x = torch.arange(4096, device="cuda")
    op(x, 1, 0)  # loads the code outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(x, 1, 0)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.roll(torch.arange(4096), -4))


@pytest.mark.gpu
def test_autotune_keeps_a_candidate_whose_grid_is_resident(gpu_cache, launcher):
    @pnex.jit(n_threads="x.size(0)", threads_per_block=[1024, 256, 32])
    def total_of_all(x: pnex.In("f32", (None,)), out: pnex.Out("f32", (1,), init=0.0)):
        i = cuda.grid(1)
        cuda.atomic.add(out, 0, x[i])
        cuda.cg.this_grid().sync()

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # 32-thread blocks: 64 per SM would be needed, above the 32 blocks an SM holds (16 before sm_80's)
    x = torch.ones(1024 * 2 * sms, device="cuda")
    torch.testing.assert_close(total_of_all(x), torch.tensor([float(x.numel())], device="cuda"))
    from pnex_magic.launch import autotune

    results = autotune.results(total_of_all.definition)
    skipped = [c for r in results for c in r.candidates if c.block == (32,)]
    assert skipped and all("synchronises its grid" in c.skipped for c in skipped)
    assert all(r.block != (32,) for r in results)


@pytest.mark.gpu
def test_a_checked_cooperative_launch_finds_an_access_out_of_bounds(gpu_cache, launcher):
    op = _rotate(block=32, check=True)
    x = torch.arange(1000, device="cuda")
    op(x, 9, 24)
    assert torch.equal(x.cpu(), torch.roll(torch.arange(1000), -9))
    with pytest.raises(KernelIndexError, match=r"index 64 is out of bounds"):
        _shifted(block=32)(torch.zeros(64, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("without_cubin", [False, True])
def test_a_loaded_artifact_launches_cooperatively_in_a_fresh_process(gpu_cache, launcher, pnex_env, tmp_path,
                                                                    without_cubin):
    """With its cubin, and without one for this GPU (its PTX linked by nvJitLink with the
    device runtime at load), in a process that cannot import Numba or NVVM."""
    from blocked_imports import run_blocked

    native.load_launcher()
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    archs = ("sm_75",) if without_cubin and arch != "sm_75" else (arch,)
    path = pnex.save(_rotate(block=32), tmp_path / "rotate.pnex", archs=archs)
    result = run_blocked(
        f"""
        import torch
        import pnex_magic as pnex
        op = pnex.load({str(path)!r})
        assert op.definition.cooperative
        x = torch.arange(4000, device="cuda")
        op(x, 11, 0)
        assert torch.equal(x.cpu(), torch.roll(torch.arange(4000), -11))
        print("OK")
        """,
        {**pnex_env, "PNEX_LAUNCHER": launcher},
        block_nvjitlink=False,
    )
    assert "OK" in result.stdout, result.stderr[-3000:]


@pytest.mark.gpu
def test_jax_launches_it_cooperatively(gpu_cache):
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU here (pip install 'jax[cuda13]')")
    f = pnex.jax_op(_rotate(block=32))
    x = np.arange(3000, dtype=np.int32)  # int64 only with jax_enable_x64: rotate takes int64
    jax.config.update("jax_enable_x64", True)
    try:
        result = jax.jit(f, static_argnums=(1, 2))(jax.numpy.asarray(x, dtype=jax.numpy.int64), 5, 0)
    finally:
        jax.config.update("jax_enable_x64", False)
    result = result[0] if isinstance(result, (tuple, list)) else result
    np.testing.assert_array_equal(np.asarray(result), np.roll(x, -5))
