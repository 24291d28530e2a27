"""Checked kernels on a GPU (:mod:`pnex_magic.checking`): the record the GPU writes
equals the simulator's, the access out of bounds did not happen, and the CUDA
context is still usable afterwards.

Each kernel has exactly one access out of bounds (one thread), so the first
violation is the same everywhere.  The launch goes through
:class:`pnex_magic.launch.driver.DriverLauncher` with a stand-in kernel (the checked
spec and cubin), as the op's launchers will once the lead wires ``check=True`` in.
"""

from __future__ import annotations

import pytest
import torch
from numba import cuda, float32

import pnex_magic as pnex
from pnex_magic import checking as C
from toolchain import simulable

pytestmark = pytest.mark.gpu


@pnex.jit(n_threads="a.numel()")
def out_1d(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a", init=0.0)):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i + 1] = a[i]


@pnex.jit(n_threads=("u.size(1)", "u.size(0)"))
def inmut_2d(u: pnex.InMut("f32", (None, None))):
    x, y = cuda.grid(2)
    rows, cols = u.shape
    if y < rows and x < cols:
        extra = 1 if (y == rows - 1 and x == cols - 1) else 0
        u[y + extra, x] += 1.0


@pnex.jit(n_threads=("a.size(2)", "a.size(1)", "a.size(0)"))
def in_3d(a: pnex.In("f32", (None, None, None)), out: pnex.Out("f32", "a", init=0.0)):
    x, y, z = cuda.grid(3)
    if z < a.shape[0] and y < a.shape[1] and x < a.shape[2]:
        extra = 1 if (z == a.shape[0] - 1 and y == a.shape[1] - 1 and x == a.shape[2] - 1) else 0
        out[z, y, x] = a[z, y + extra, x] + 1.0


class _Checked:
    """The checked variant of an op as a launcher's kernel."""

    def __init__(self, op):
        d = op._pnex
        self.ck = d.checked_kernel()  # the op's own: accesses its source proves are left unchecked
        self.spec = C.checked_spec(d.spec)
        self.options = d.options
        self._d = d

    op_name = property(lambda self: self._d.op_name + "_checked")
    compiles = True

    def kernel_image(self, arch, layout="C", variant=0, checked=False):
        from pnex_magic.compiler import compile_kernel

        compiled = compile_kernel(self.ck.function, self.spec, arch=arch, key=f"checked-test-{self.op_name}-{layout}",
                                  use_cache=False, layout=layout)
        return compiled.cubin, compiled.entry

    def simulated_function(self, checked=False, variant=0):
        from pnex_magic.compiler import numba_signature
        from pnex_magic.simtyping import typed_kernel

        return simulable(typed_kernel(self.ck.function, numba_signature(self.spec, "A"), self.spec.name))


def _launch(op, args, device):
    """(outputs, record, checked kernel) of the checked variant of ``op`` on ``args``."""
    from pnex_magic.calls import bind_arguments, launch_grid, output_shapes
    from pnex_magic.launch import driver, simulator

    kernel = _Checked(op)
    spec = op._pnex.spec
    env = bind_arguments(spec, args)
    outs = [torch.full(s, p.init or 0, dtype=p.dtype.torch, device=device)
            for p, s in zip(spec.outputs, output_shapes(spec, env))]
    env.update({p.name: t for p, t in zip(spec.outputs, outs)})
    record = C.error_buffer(device)
    values = [env[p.name] for p in spec.params] + [record]
    grid, block = launch_grid(spec, env, spec.threads_per_block)
    launcher = driver.DriverLauncher() if device == "cuda" else simulator.SimulatorLauncher()
    launcher.launch(kernel, values, grid, block, torch.device(device))
    if device == "cuda":
        torch.cuda.synchronize()
    return outs, record.cpu(), kernel.ck


@pytest.mark.parametrize(
    "op, make",
    [
        (out_1d, lambda d: (torch.arange(1000, dtype=torch.float32, device=d),)),
        (inmut_2d, lambda d: (torch.zeros(37, 45, device=d),)),
        (in_3d, lambda d: (torch.ones(3, 5, 70, device=d),)),
    ],
    ids=["out_1d", "inmut_2d", "in_3d"],
)
def test_the_gpu_record_equals_the_simulators_and_the_context_survives(op, make):
    gpu_args = make("cuda")
    outs, record, ck = _launch(op, gpu_args, "cuda")
    cpu_args = make("cpu")
    sim_outs, sim_record, _ = _launch(op, cpu_args, "cpu")
    assert record[0] == 1, "no violation recorded on the GPU"
    assert record.tolist() == sim_record.tolist(), (ck.describe(record), ck.describe(sim_record))
    for gpu_out, cpu_out in zip([*outs, *gpu_args], [*sim_outs, *cpu_args]):
        torch.testing.assert_close(gpu_out.cpu(), cpu_out)  # the access did not happen on either
    assert torch.ones(4, device="cuda").sum().item() == 4  # the CUDA context is intact
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    torch.testing.assert_close(out_1d(x)[1:], x[:-1])  # and a pnex op runs
    assert "is out of bounds for axis" in ck.describe(record)


def test_correct_kernels_give_the_same_results_checked_on_the_gpu():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import workloads as wl

    u = wl.initial_field(300).cuda()
    _, record, _ = _launch_inmut(wl.diffusion_step, (u, torch.zeros_like(u), 0.25))
    assert record.tolist() == [0] * C.RECORD_SIZE


def _launch_inmut(op, args):
    """The checked variant of ``op`` writes its InMut ``args[1]`` as the fast op does."""
    from pnex_magic.calls import bind_arguments, launch_grid
    from pnex_magic.launch import driver

    kernel = _Checked(op)
    spec = op._pnex.spec
    env = bind_arguments(spec, args)
    record = C.error_buffer("cuda")
    values = [env[p.name] for p in spec.params] + [record]
    grid, block = launch_grid(spec, env, spec.threads_per_block)
    driver.DriverLauncher().launch(kernel, values, grid, block, torch.device("cuda"))
    torch.cuda.synchronize()
    fast = torch.zeros_like(args[1])
    op(args[0], fast, *args[2:])
    torch.testing.assert_close(args[1], fast, rtol=0, atol=0)
    return (args[1],), record.cpu(), kernel.ck


@pnex.jit(n_threads="a.numel()", threads_per_block=64, check=True)
def mirrored_tiles(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = a[i] if i < a.shape[0] else 0.0
    cuda.syncthreads()
    if i < a.shape[0]:
        out[i] = tile[63 - t] + a[i]


@pnex.jit(n_threads="a.numel()", threads_per_block=64, check=True)
def shifted_tiles(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = a[i] if i < a.shape[0] else 0.0
    cuda.syncthreads()
    if i < a.shape[0]:
        out[i] = tile[t + 1] + a[i]  # thread 63 reads past the tile


def test_every_access_proven_the_checked_op_gives_the_fast_result_and_a_bug_beside_them_is_caught():
    variant = mirrored_tiles._pnex.checked_kernel()
    assert not variant.sites and len(variant.proven) == 5  # nothing left to test at run time
    a = torch.rand(1000, device="cuda")
    padded = torch.zeros(1024, dtype=torch.float64, device="cuda")
    padded[:1000] = a.double()
    expected = (padded.view(16, 64).flip(1).reshape(-1)[:1000] + a.double())
    torch.testing.assert_close(mirrored_tiles(a).double(), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(IndexError, match=r"index 64 is out of bounds for axis 0 of shared array 'tile'"):
        shifted_tiles(a)
    assert torch.ones(4, device="cuda").sum().item() == 4  # the CUDA context is intact
