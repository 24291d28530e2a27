"""Device arrays read as globals, on the GPU (issue 26): passed as hidden arguments by
both GPU launchers (the C++ one and the Python driver one), in CUDA graphs, under
torch.compile, with autotuning and checked launches.  The CPU forms are in
``tests/test_globals.py``; case 1 (a new process, the same cache) is in
``tests/test_numba_doc_examples.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.errors import ArgumentTypeError, KernelIndexError, KernelLaunchError

pytestmark = pytest.mark.gpu


def _define(table, **options):
    @pnex.jit(n_threads="a.numel()", **options)
    def adds_table(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + table[i % table.shape[0]]

    return adds_table


def test_a_cuda_tensor_global_is_passed_at_every_launch(gpu_cache, launcher):
    table = torch.randn(7, device="cuda")
    op = _define(table)
    a = torch.randn(1000, device="cuda")
    torch.testing.assert_close(op(a), a + table.repeat(143)[:1000])
    table.mul_(-2.0)  # in place: the next launch sees it
    torch.testing.assert_close(op(a), a + table.repeat(143)[:1000])
    table.set_(torch.randn(3, device="cuda"))  # the same tensor, other memory and size: read at each launch
    torch.testing.assert_close(op(a), a + table.repeat(334)[:1000])


def test_a_numba_device_array_global_is_passed_at_every_launch(gpu_cache, launcher):
    prices = cuda.to_device(np.array([10.0, 25.0, 5.0, 15.0, 30.0], dtype=np.float32))

    @pnex.jit(n_threads="totals.numel()")
    def compute_totals(quantities: pnex.In("f32", (None,)), totals: pnex.Out("f32", "quantities")):
        i = cuda.grid(1)
        if i < totals.size:
            totals[i] = quantities[i] * prices[i]

    q = torch.ones(5, device="cuda")
    torch.testing.assert_close(compute_totals(q).cpu(), torch.tensor([10.0, 25.0, 5.0, 15.0, 30.0]))
    prices.copy_to_device(np.array([20.0, 50.0, 10.0, 30.0, 60.0], dtype=np.float32))
    torch.testing.assert_close(compute_totals(q).cpu(), torch.tensor([20.0, 50.0, 10.0, 30.0, 60.0]))


def test_a_cuda_graph_replays_with_the_global_as_it_is_then(gpu_cache, launcher):
    table = torch.randn(4, device="cuda")
    op = _define(table)
    a = torch.randn(64, device="cuda")
    op(a)  # compiled and loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(a)
    table.add_(5.0)  # the captured address is the tensor's memory: an update in place is seen
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a + table.repeat(16))


def test_a_global_on_another_device_or_of_another_type_is_refused_naming_it(gpu_cache, launcher):
    on_cpu = torch.randn(4)
    with pytest.raises(ArgumentTypeError, match=r"reads the global 'table', a tensor on cpu, but this call's tensors "
                                                r"are on cuda:0"):
        _define(on_cpu)(torch.randn(8, device="cuda"))
    on_gpu = torch.randn(4, device="cuda")
    op = _define(on_gpu)
    with pytest.raises(ArgumentTypeError, match=r"reads the global 'table', a tensor on cuda:0, but this call's tensors "
                                                r"are on cpu"):
        op(torch.randn(8))
    on_gpu.set_(torch.randn(2, 2, device="cuda"))
    with pytest.raises(KernelLaunchError, match=r"reads the global 'table', which was a float32, 1-D, contiguous array "
                                                r"when the kernel was defined and is now float32, 2-D, contiguous"):
        op(torch.randn(8, device="cuda"))


def test_autotuning_leaves_a_global_the_kernel_writes_as_one_launch_would(gpu_cache, launcher):
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")

    @pnex.jit(n_threads="a.numel()", threads_per_block="auto")
    def counts(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]
            cuda.atomic.add(counter, 0, 1)

    a = torch.randn(5000, device="cuda")
    torch.testing.assert_close(counts(a), a)  # tunes: every candidate runs, several times
    assert counter.item() == 5000
    counts(a)
    assert counter.item() == 10000


def test_a_checked_launch_names_the_global_it_reads_past(gpu_cache, launcher):
    table = torch.arange(4.0, device="cuda")

    @pnex.jit(n_threads="a.numel()", check=True)
    def reads_past(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + table[i]

    torch.testing.assert_close(reads_past(torch.ones(4, device="cuda")), table + 1)
    with pytest.raises(KernelIndexError, match=r"global device array 'table' \(shape \(4,\)\)"):
        reads_past(torch.ones(6, device="cuda"))
    torch.cuda.synchronize()  # the context survived


def test_a_global_under_torch_compile(gpu_cache, launcher):
    table = torch.randn(8, device="cuda")
    op = _define(table)
    a = torch.randn(64, device="cuda")
    compiled = torch.compile(lambda x: op(x) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(a), (a + table.repeat(8)) * 2)
    table.sub_(3.0)
    torch.testing.assert_close(compiled(a), (a + table.repeat(8)) * 2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_global_on_another_gpu_is_refused(gpu_cache, launcher):
    op = _define(torch.randn(4, device="cuda:1"))
    with pytest.raises(ArgumentTypeError, match=r"a tensor on cuda:1, but this call's tensors are on cuda:0"):
        op(torch.randn(8, device="cuda:0"))
