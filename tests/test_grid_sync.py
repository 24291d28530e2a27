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
import zipfile

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import linking
from pnex_magic.errors import KernelCompileError, KernelIndexError, KernelLaunchError
from pnex_magic.launch import cooperative, grid_simulator, native

from toolchain import needs_nvvm


def _sequential_rows(block=4, check=False):
    """numba-cuda's doc example (test_cg.py): row r's element c is row r-1's element at
    the mirrored column, plus one, so every row reads the other blocks' last writes."""

    @pnex.jit(n_threads="M.size(1)", threads_per_block=block, check=check)
    def sequential_rows(M: pnex.InMut("i32", (None, None))):
        col = cuda.grid(1)
        g = cuda.cg.this_grid()
        rows = M.shape[0]
        cols = M.shape[1]
        for row in range(1, rows):
            opposite = cols - col - 1
            M[row, col] = M[row - 1, opposite] + 1
            g.sync()

    return sequential_rows


def _heat(block=8):
    """The Laplace example's kernel (test_laplace.py): threads past the end return
    before the loop; every block keeps its thread 0."""

    @pnex.jit(n_threads="buf_0.size(0)", threads_per_block=block)
    def solve_heat_equation(buf_0: pnex.InMut("f64", (None,)), buf_1: pnex.InMut("f64", "buf_0"), timesteps: int,
                            k: float):
        i = cuda.grid(1)
        if i >= len(buf_0):
            return
        grid = cuda.cg.this_grid()
        for step in range(timesteps):
            if (step % 2) == 0:
                data = buf_0
                next_data = buf_1
            else:
                data = buf_1
                next_data = buf_0
            curr_temp = data[i]
            if i == 0:
                next_temp = curr_temp + k * (data[i + 1] - (2 * curr_temp))
            elif i == len(data) - 1:
                next_temp = curr_temp + k * (data[i - 1] - (2 * curr_temp))
            else:
                next_temp = curr_temp + k * (data[i - 1] - (2 * curr_temp) + data[i + 1])
            next_data[i] = next_temp
            grid.sync()

    return solve_heat_equation


def _heat_reference(data: np.ndarray, steps: int, k: float) -> np.ndarray:
    a, b = data.astype(np.float64).copy(), np.zeros_like(data, dtype=np.float64)
    for step in range(steps):
        src, dst = (a, b) if step % 2 == 0 else (b, a)
        left = np.concatenate([[0.0], src[:-1]])
        right = np.concatenate([src[1:], [0.0]])
        dst[:] = src + k * (left - 2 * src + right)
    return b if steps % 2 else a


def _mirror_reference(n: int) -> np.ndarray:
    return np.tile(np.arange(n, dtype=np.int32), (n, 1)).T


# ---------------------------------------------------------------------------- the simulator


def test_the_simulator_syncs_the_whole_grid():
    op = _sequential_rows(block=4)
    a = torch.full((16, 16), -7, dtype=torch.int32)
    a[0] = 0
    op(a)
    np.testing.assert_array_equal(a.numpy(), _mirror_reference(16))


def test_numbas_own_simulator_would_not_which_is_why_pnex_runs_every_block_at_once():
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    op = _sequential_rows(block=4)
    a = np.zeros((16, 16), np.int32)
    FakeCUDAKernel(op.definition.simulated_function(), device=False)[4, 4](FakeCUDAArray(a))
    assert not np.array_equal(a, _mirror_reference(16))  # blocks one by one: the mirror reads stale rows
    assert grid_simulator.uses_grid_sync(op.definition.simulated_function())


def test_threads_that_return_early_do_not_block_the_sync():
    rng = np.random.default_rng(1)
    n, steps, k = 37, 40, 0.25  # 5 blocks of 8: the last block's threads past 37 return at once
    data = rng.random(n) * 100
    op = _heat(block=8)
    a, b = torch.tensor(data), torch.full((n,), float("nan"), dtype=torch.float64)
    op(a, b, steps, k)
    expected = _heat_reference(data, steps, k)
    got = (a if steps % 2 == 0 else b).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


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

    with pytest.raises(KernelLaunchError, match=r"cuda.syncthreads\(\) while others wait at a grid sync"):
        mixed_barriers(torch.zeros(8))


def test_too_many_threads_for_the_simulator_is_a_clear_error():
    op = _sequential_rows(block=64)
    n = grid_simulator.MAX_THREADS + 64
    with pytest.raises(KernelLaunchError, match=rf"this launch has {n} .*more than the {grid_simulator.MAX_THREADS}"):
        op(torch.zeros((2, n), dtype=torch.int32))


def test_an_exception_in_one_thread_is_reported_with_its_line():
    @pnex.jit(n_threads="x.size(0)", threads_per_block=4)
    def reads_past_the_end(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        cuda.cg.this_grid().sync()
        x[i] = x[i + 1]

    with pytest.raises(KernelLaunchError, match=r"x\[i\] = x\[i \+ 1\]"):
        reads_past_the_end(torch.zeros(8))


def test_the_checked_variant_syncs_the_grid_and_names_an_access_out_of_bounds():
    op = _sequential_rows(block=4, check=True)
    a = torch.zeros((8, 8), dtype=torch.int32)
    op(a)
    np.testing.assert_array_equal(a.numpy(), _mirror_reference(8))

    @pnex.jit(n_threads="x.size(0)", threads_per_block=4, check=True)
    def shifted(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        cuda.cg.this_grid().sync()
        x[i + 1] = 1.0

    with pytest.raises(KernelIndexError, match=r"index 8 is out of bounds for axis 0 of parameter 'x'"):
        shifted(torch.zeros(8))


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
    op = _sequential_rows()
    compiled = op.definition.compiled()
    assert compiled.cubin is not None and compiled.cooperative and op.definition.cooperative
    assert linking.uses_grid_sync(compiled.ptx) and not linking.has_external_calls(compiled.ptx)
    checked = op.definition.compiled(checked=True)
    assert checked.cubin is not None and checked.cooperative
    meta = [json.loads(p.read_text()) for p in fresh_cache.rglob("meta.json")]
    assert meta and all(m["cooperative"] for m in meta)
    # A new definition of the same kernel is a cache hit that still says so.
    again = _sequential_rows().definition.compiled()
    assert again.cache_hit and again.cooperative
    plain = _heat_free_kernel().definition
    assert not plain.compiled().cooperative and not plain.cooperative


def _heat_free_kernel():
    @pnex.jit(n_threads="x.size(0)")
    def plain_copy(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i]

    return plain_copy


@needs_nvvm
def test_the_launchers_are_told_to_launch_it_cooperatively():
    assert native.launcher_spec(_sequential_rows().definition)["cooperative"] is True
    assert native.launcher_spec(_heat_free_kernel().definition)["cooperative"] is False


@needs_nvvm
def test_a_saved_artifact_keeps_the_flag_and_links_every_architecture(tmp_path):
    op = _sequential_rows()
    path = pnex.save(op, tmp_path / "rows.pnex", archs=("sm_75", "sm_90"))
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
    op = _sequential_rows(block=32)  # the docs' launch: 32 blocks of one warp
    a = torch.full((1024, 1024), -1, dtype=torch.int32, device="cuda")
    a[0] = 0
    op(a)
    np.testing.assert_array_equal(a.cpu().numpy(), _mirror_reference(1024))
    data = np.random.default_rng(3).random(1001) * 100
    x, y = torch.tensor(data, device="cuda"), torch.zeros(1001, dtype=torch.float64, device="cuda")
    _heat(block=128)(x, y, 1000, 0.25)
    np.testing.assert_allclose(x.cpu().numpy(), _heat_reference(data, 1000, 0.25), rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
def test_a_grid_that_cannot_be_resident_is_refused_and_the_context_survives(gpu_cache, launcher):
    op = _sequential_rows(block=1024)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cols = 1024 * (2 * sms + 1)  # at most 2 blocks of 1024 threads per SM on any GPU pnex supports
    with pytest.raises(KernelLaunchError, match=r"synchronises its grid.*blocks of 1024 threads.*per SM x "
                                                rf"{sms} SMs.*grid-stride loop"):
        op(torch.zeros((2, cols), dtype=torch.int32, device="cuda"))
    a = torch.zeros((64, 64), dtype=torch.int32, device="cuda")
    _sequential_rows(block=32)(a)
    np.testing.assert_array_equal(a.cpu().numpy(), _mirror_reference(64))


@pytest.mark.gpu
def test_a_cooperative_launch_is_captured_in_a_cuda_graph(gpu_cache, launcher):
    @pnex.jit(n_threads="x.size(0)", threads_per_block=64)
    def shift_left(x: pnex.InMut("i64", (None,))):
        i = cuda.grid(1)
        g = cuda.cg.this_grid()
        v = x[(i + 1) % x.shape[0]]
        g.sync()
        x[i] = v

    x = torch.arange(4096, device="cuda")
    shift_left(x)  # loads the code outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        shift_left(x)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.roll(torch.arange(4096), -5))


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
    op = _sequential_rows(block=32, check=True)
    a = torch.zeros((128, 128), dtype=torch.int32, device="cuda")
    op(a)
    np.testing.assert_array_equal(a.cpu().numpy(), _mirror_reference(128))

    @pnex.jit(n_threads="x.size(0)", threads_per_block=32, check=True)
    def shifted(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        cuda.cg.this_grid().sync()
        x[i + 1] = 1.0

    with pytest.raises(KernelIndexError, match=r"index 64 is out of bounds"):
        shifted(torch.zeros(64, device="cuda"))


@pytest.mark.gpu
def test_jax_launches_it_cooperatively(gpu_cache):
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU here (pip install 'jax[cuda13]')")
    op = _sequential_rows(block=32)
    f = pnex.jax_op(op)
    a = np.zeros((256, 256), np.int32)
    result = jax.jit(f)(jax.numpy.asarray(a))
    result = result[0] if isinstance(result, (tuple, list)) else result
    np.testing.assert_array_equal(np.asarray(result), _mirror_reference(256))
