"""Dynamic shared memory (``shared_bytes=``) on a GPU: above static shared memory's
48 KiB, through both GPU launchers (the C++ one and the Python driver one) and JAX's
(the XLA FFI handler and the Python callback), an autotuned kernel whose ``Tune``
variants launch with different bytes, cooperative launches whose residency counts
them, and a clear error above the device's limit.  Skipped where there is no NVIDIA
GPU; ``tests/test_dynamic_shared.py`` covers the rest without one.

    python3 -m pytest -q tests/test_dynamic_shared_gpu.py
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from numba import cuda, float32

import pnex_magic as pnex
from pnex_magic.errors import KernelLaunchError
from pnex_magic.launch import autotune

pytestmark = pytest.mark.gpu

ROW = 25600  # float32 elements of 100 KiB


def _reverse_rows():
    """Each block stages one row of 25,600 floats (100 KiB) in dynamic shared memory and
    writes it back reversed: every byte of the 100 KiB is written and read."""

    @pnex.jit(n_threads="x.size(0) * 256", threads_per_block=256, shared_bytes=ROW * 4)
    def reverse_rows(x: pnex.In("f32", (None, 25600)), out: pnex.Out("f32", "x")):
        smem = cuda.shared.array(0, float32)
        b = cuda.blockIdx.x
        t = cuda.threadIdx.x
        for k in range(100):
            smem[k * 256 + t] = x[b, k * 256 + t]
        cuda.syncthreads()
        for k in range(100):
            j = k * 256 + t
            out[b, j] = smem[25599 - j]

    return reverse_rows


def test_100_kib_of_dynamic_shared_memory_on_both_launchers(gpu_cache, launcher):
    op = _reverse_rows()
    x = torch.randn(3 * torch.cuda.get_device_properties(0).multi_processor_count, ROW, device="cuda")
    out = op(x)
    assert torch.equal(out, x.flip(1))
    report = pnex.inspect(op)
    assert report.dynamic_shared_bytes == ROW * 4 and "102,400 B dynamic" in str(report)


def _staged():
    """A copy through all of the variant's dynamic shared memory (STAGES x 32 KiB: 32, 64
    and 128 KiB), reversed in and out again, so every variant gives the same result; a
    launch that passed other bytes than the variant's writes NaN (the array's length is
    read from %dynamic_smem_size at run time)."""

    @pnex.jit(n_threads="x.numel() // (STAGES * 32)", threads_per_block=256, shared_bytes="STAGES * 32 * 1024")
    def staged(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x"), STAGES: pnex.Tune(1, 2, 4)):
        smem = cuda.shared.array(0, float32)
        chunk = STAGES * 8192
        base = cuda.blockIdx.x * chunk
        t = cuda.threadIdx.x
        for k in range(STAGES * 32):
            j = k * 256 + t
            smem[chunk - 1 - j] = x[base + j]
        cuda.syncthreads()
        wrong = smem.shape[0] != chunk
        for k in range(STAGES * 32):
            j = k * 256 + t
            out[base + j] = np.nan if wrong else smem[chunk - 1 - j]

    return staged


def test_an_autotuned_kernel_whose_variants_need_different_bytes(gpu_cache, launcher):
    op = _staged()
    assert op.spec.shared_per_variant == (32768, 65536, 131072)
    x = torch.randn(1 << 20, device="cuda")  # a multiple of every variant's chunk
    assert torch.equal(op(x), x)
    result = autotune.result_for(op.definition, (x,))
    assert result.source == "benchmarked"
    assert [c.variant for c in result.candidates if c.seconds is not None] == [0, 1, 2]  # none skipped, none differs
    if launcher == "native":
        from pnex_magic.launch.native import forced_candidate

        for index in range(len(op.spec.launch_candidates)):
            with forced_candidate(op.definition.op_name, index):
                assert torch.equal(op(x), x), op.spec.launch_candidates[index]


def _optin_limit(index: int = 0) -> int:
    """CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN of cuda:``index``, from the driver."""
    from cuda.bindings import driver

    torch.cuda.init()
    err, dev = driver.cuDeviceGet(index)
    assert err == driver.CUresult.CUDA_SUCCESS
    err, most = driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)
    assert err == driver.CUresult.CUDA_SUCCESS
    return int(most)


def test_above_the_devices_limit_is_a_clear_error_naming_the_kernel_option_and_bytes(gpu_cache, launcher):
    """The definition checks the dynamic bytes alone against the GPU's limit; at launch the
    driver's figures count the kernel's static shared memory too: the device's whole limit
    asked as dynamic memory beside 1 KiB of static is refused there, in the user's terms,
    by both launchers, and the context survives."""
    most = _optin_limit()

    @pnex.jit(n_threads="x.numel()", threads_per_block=32, shared_bytes=most)
    def too_big(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        fixed = cuda.shared.array(256, float32)  # 1 KiB of static shared memory
        smem = cuda.shared.array(0, float32)
        i = cuda.grid(1)
        fixed[cuda.threadIdx.x] = x[i]
        smem[cuda.threadIdx.x] = fixed[cuda.threadIdx.x]
        out[i] = smem[cuda.threadIdx.x]

    with pytest.raises(KernelLaunchError, match=(
            rf"kernel 'too_big': shared_bytes asks for {most} B of dynamic shared memory per block, but cuda:0 allows "
            rf"a block at most {most} B of shared memory .* static shared memory takes (\d+) B of it, which leaves "
            rf"\d+ B for shared_bytes")) as info:
        too_big(torch.randn(32, device="cuda"))
    assert int(re.search(r"static shared memory takes (\d+) B", str(info.value)).group(1)) >= 1024
    x = torch.randn(4 * ROW, device="cuda").view(4, ROW)
    assert torch.equal(_reverse_rows()(x), x.flip(1))  # the context is fine


def test_a_cooperative_launch_counts_dynamic_shared_memory_in_its_residency(gpu_cache, launcher):
    """100 KiB per block (and 1 KiB the system keeps per block): 2 blocks per SM of 228 KiB
    (sm_90), 1 of 164 KiB (sm_80); one block more than every SM holds is refused."""

    @pnex.jit(n_threads="x.size(0)", threads_per_block=128, shared_bytes=100 * 1024)
    def neighbours(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        smem = cuda.shared.array(0, float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        smem[25599 - t] = x[i]
        cuda.cg.this_grid().sync()
        out[i] = smem[25599 - t]

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    per_sm = props.shared_memory_per_multiprocessor // (101 * 1024)
    x = torch.randn(128 * per_sm * sms, device="cuda")
    assert torch.equal(neighbours(x), x)
    with pytest.raises(KernelLaunchError, match=rf"at most {per_sm} such blocks per SM x {sms} SMs"):
        neighbours(torch.randn(128 * (per_sm * sms + 1), device="cuda"))


def test_jax_launches_with_the_dynamic_shared_memory(gpu_cache, launcher):
    """native: the XLA FFI handler (its custom call in the program); driver: the Python
    callback through pnex's driver launcher, unless an earlier test of this process
    loaded the handler (it then serves every trace: xla.ready)."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from pnex_magic.launch import xla

    try:
        jax.devices("cuda")
    except RuntimeError:
        pytest.skip("JAX has no CUDA backend here")
    f = pnex.jax_op(_reverse_rows())
    x = jax.random.normal(jax.random.key(0), (8, ROW), jnp.float32)
    text = jax.jit(f).lower(x).as_text()
    assert (f"@{xla.TARGET}(" in text) == (launcher == "native" or xla.library_available())
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), np.asarray(x)[:, ::-1])


def test_a_checked_launch_bounds_checks_the_dynamic_array_by_the_bytes_launched(gpu_cache, launcher):
    """The array's length comes from %dynamic_smem_size: the checked variant tests accesses
    against the bytes the launch passed (100 KiB here, above the 48 KiB opt-in)."""
    from pnex_magic.errors import KernelIndexError

    @pnex.jit(n_threads="x.numel()", threads_per_block=32, shared_bytes=ROW * 4, check=True)
    def top_of_smem(x: pnex.In("f32", (32,)), out: pnex.Out("f32", "x"), last: int):
        smem = cuda.shared.array(0, float32)
        t = cuda.threadIdx.x
        smem[last - t] = x[t]
        cuda.syncthreads()
        out[t] = smem[last - t]

    x = torch.randn(32, device="cuda")
    assert torch.equal(top_of_smem(x, ROW - 1), x)  # the last 32 elements of the 100 KiB
    with pytest.raises(KernelIndexError, match=rf"index {ROW} is out of bounds for axis 0 of .*'smem'.*\({ROW},\)"):
        top_of_smem(x, ROW)
