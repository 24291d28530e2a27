"""numba-cuda's documentation examples, ported to pnex (``examples/numba_docs/``, issue 26).

Every file there is one port (files starting with ``_`` are helpers).  A port defines:

* ``TITLE`` (one line) and ``SOURCE`` (the numba-cuda file and function it ports);
* ``GPU_ONLY``: True only for CUDA C++ ports, which on CPU tensors must raise
  ``KernelLaunchError`` naming the foreign function (``FOREIGN``) and saying that the
  kernel runs on a GPU only;
* ``TOLERANCE``: ``dict(rtol=..., atol=...)`` against a float64 reference (0 for exact);
* ``run(device, seed) -> (results, references)``: tensors the port computes on fresh
  inputs drawn from ``seed`` and independent references (torch or NumPy, float64,
  without pnex), under the same keys;
* optionally ``timed(device) -> (pnex call, torch equivalent or None)`` for
  ``benchmarks/doc_examples.py``, and ``REQUIRES``: modules it needs beyond pnex's own
  (the test is skipped with a reason where one is missing).

Each port runs on CPU tensors (numba-cuda's simulator) and, marked ``gpu``, on the GPU,
with PyTorch filling every tensor it allocates (the ops' outputs) with NaN or the
largest integer first, so an output the kernel does not write fails the comparison.
The GPU tests of issue 26's cases 1 to 3 are here too.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from numba.cuda import types as nbtypes

import pnex_magic as pnex
from pnex_magic.errors import KernelDefinitionError, KernelLaunchError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "numba_docs"
sys.path.insert(0, str(EXAMPLES))
from _harness import compare, load, missing_requirements, poisoned_outputs, ports  # noqa: E402

NAMES = ports()


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def skip_unless_requirements(module) -> None:
    missing = missing_requirements(module)
    if missing:
        pytest.skip(f"the port {module.__name__} needs {', '.join(missing)}")


def check_results(module, results: dict, references: dict, seed: int) -> None:
    _, problems = compare(module, results, references)
    assert problems == [], f"{module.__name__} (seed {seed})"


def test_the_ports_are_there():
    assert {"vecadd", "matmul", "fast_matmul", "reduction", "ufunc", "globals_constant", "globals_device_array",
            "cpu_gpu_compat", "cpointer", "ffi_linking", "ffi_from_buffer", "ffi_saxpy",
            "laplace", "sessionize", "cg", "montecarlo", "random_3d"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_each_port_declares_what_the_harness_reads(name):
    module = load(name)
    assert isinstance(module.TITLE, str) and module.TITLE and "\n" not in module.TITLE
    assert isinstance(module.SOURCE, str) and module.SOURCE.startswith("numba_cuda/numba/cuda/tests/doc_examples/")
    assert isinstance(module.GPU_ONLY, bool)
    assert set(module.TOLERANCE) == {"rtol", "atol"} and all(v >= 0 for v in module.TOLERANCE.values())
    assert callable(module.run)
    if module.GPU_ONLY:
        assert isinstance(module.FOREIGN, str)


@pytest.mark.parametrize("name", NAMES)
def test_each_port_on_cpu_tensors(name, fresh_cache):
    """In the simulator: the result equals the reference; a CUDA C++ port is refused,
    naming its foreign function."""
    module = load(name)
    skip_unless_requirements(module)
    seed = fresh_seed()
    if module.GPU_ONLY:
        with pytest.raises(KernelLaunchError, match=rf"calls CUDA C\+\+ \('{module.FOREIGN}'.*runs on a GPU only"):
            module.run("cpu", seed)
        return
    with poisoned_outputs():
        results, references = module.run("cpu", seed)
    check_results(module, results, references, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_each_port_on_the_gpu(name, gpu_cache, launcher):
    module = load(name)
    skip_unless_requirements(module)
    seed = fresh_seed()
    with poisoned_outputs():
        results, references = module.run("cuda", seed)
    check_results(module, results, references, seed)
    assert all(t.is_cuda for t in results.values())
    torch.cuda.synchronize()


class _CudaAtCpuSize(str):
    """The device name ``"cuda"`` for torch (tensors go to the GPU), which a port's
    ``device == "cpu"`` and ``device != "cpu"`` read as the CPU's: so the GPU runs the
    problem a port gives the simulator (ports size their problems by device)."""

    def __eq__(self, other):
        return other == "cpu" if isinstance(other, str) and other in ("cpu", "cuda") else str.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_each_port_gives_the_same_results_on_cpu_and_gpu(name, gpu_cache):
    """Issue 34: the simulator computes what the GPU computes.  Each port runs the same
    problem (the CPU's size, the same seed) in the simulator and on the GPU; the results
    agree within the port's tolerance (the GPU fuses a * b + c where the simulator rounds
    twice, and orders atomics and reductions its own way), and are counted when equal
    bit for bit."""
    module = load(name)
    skip_unless_requirements(module)
    if module.GPU_ONLY:
        pytest.skip("CUDA C++: it runs on a GPU only")
    seed = fresh_seed()
    with poisoned_outputs():
        on_cpu, references = module.run("cpu", seed)
        on_gpu, _ = module.run(_CudaAtCpuSize("cuda"), seed)
    assert on_cpu.keys() == on_gpu.keys()
    same = 0
    for key, cpu in on_cpu.items():
        gpu = on_gpu[key]
        assert gpu.is_cuda and gpu.shape == cpu.shape, (key, gpu.device, gpu.shape, cpu.shape)
        gpu = gpu.cpu()
        torch.testing.assert_close(gpu.double(), cpu.double(), equal_nan=True, **module.TOLERANCE,
                                   msg=lambda m: f"{name} (seed {seed}) {key!r}: {m}")
        same += bool(torch.equal(gpu, cpu))
    print(f"\n{name}: {same} of {len(on_cpu)} results bit for bit equal on CPU and GPU")


def test_a_raw_pointer_annotation_is_refused_with_the_port_to_make():
    """The docs' ``add_one`` takes ``CPointer(uint8)``; the port (``cpointer.py``) takes
    the tensor.  Annotating the pointer says how."""
    def add_one(x: nbtypes.CPointer(nbtypes.uint8), n: nbtypes.uint32):
        pass

    with pytest.raises(KernelDefinitionError, match=r"parameter 'x': uint8\* is a raw pointer \(CPointer\).*"
                                                    r"Annotate it InMut\('u8', \(None,\)\)"):
        pnex.jit(n_threads=32)(add_one)


# --------------------------------------------------------------------------- issue 26, cases 1 to 3

_NEW_PROCESS = """
import sys
import numpy as np
import torch
from numba import cuda
import pnex_magic as pnex

if sys.argv[1] == "allocate-first":  # other tensors take the addresses the first process had
    hold = [torch.empty(int(n), device="cuda") for n in (1 << 26, 12345, 1 << 20, 777)]

PRICES = torch.tensor([10.0, 25.0, 5.0, 15.0, 30.0], device="cuda")
COSTS = cuda.to_device(np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=np.float32))


@pnex.jit(n_threads="totals.numel()")
def compute_totals(quantities: pnex.In("f32", (None,)), totals: pnex.Out("f32", "quantities")):
    i = cuda.grid(1)
    if i < totals.size:
        totals[i] = quantities[i] * PRICES[i] + COSTS[i]


q = torch.arange(1.0, 6.0, device="cuda")
got = compute_totals(q)
torch.cuda.synchronize()
expected = q * torch.tensor([10.0, 25.0, 5.0, 15.0, 30.0], device="cuda") + torch.arange(1.0, 6.0, device="cuda")
assert torch.equal(got, expected), (got, expected)
print("HIT", pnex.inspect(compute_totals).cache_hit)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["native", "driver"])
def test_a_device_array_global_stays_right_in_a_new_process_with_the_same_cache(which, gpu_cache, tmp_path, pnex_env):
    """Case 1 of issue 26: the first process compiles a kernel that reads a torch CUDA
    tensor and a Numba device array as globals; a new process with the same cache, which
    allocated other tensors first, gets the cached code and the right result (before,
    a stale address baked into the code: an illegal memory access)."""
    script = tmp_path / "device_array_global.py"
    script.write_text(_NEW_PROCESS)
    env = dict(pnex_env, PNEX_CACHE_DIR=str(gpu_cache), PNEX_LAUNCHER=which)
    outputs = []
    for mode in ("first", "allocate-first"):
        result = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, f"{mode}:\n{result.stdout}\n{result.stderr}"
        outputs.append(result.stdout)
    assert "HIT False" in outputs[0] and "HIT True" in outputs[1]


_MODULE_GLOBALS = """
import numpy as np
from numba import cuda
import pnex_magic as pnex

TAX_RATE = 0.08
PRICES = np.array([10.0, 25.0, 5.0, 15.0, 30.0], dtype=np.float64)


@pnex.jit(n_threads="totals.numel()")
def compute_totals(quantities: pnex.In("f64", (None,)), totals: pnex.Out("f64", "quantities")):
    i = cuda.grid(1)
    if i < totals.size:
        totals[i] = quantities[i] * PRICES[i] * (1 + TAX_RATE)
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_module_globals_changed_after_the_first_call_are_frozen_in_every_layout(device, fresh_cache, tmp_path):
    """Case 2 of issue 26 (module-level globals, as in the issue's report): after
    ``TAX_RATE`` and ``PRICES`` change, a contiguous and a strided input (whose layout
    variant is compiled only then) give the same, original totals."""
    path = tmp_path / "pnex_case2_globals.py"
    path.write_text(textwrap.dedent(_MODULE_GLOBALS))
    spec = importlib.util.spec_from_file_location("pnex_case2_globals", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    q = torch.ones(5, dtype=torch.float64, device=device)
    expected = torch.tensor([10.0, 25.0, 5.0, 15.0, 30.0], dtype=torch.float64) * 1.08
    torch.testing.assert_close(module.compute_totals(q).cpu(), expected, rtol=0, atol=0)
    module.TAX_RATE = 0.10
    module.PRICES[:] = [20.0, 50.0, 10.0, 30.0, 60.0]
    strided = torch.ones(10, dtype=torch.float64, device=device)[::2]
    torch.testing.assert_close(module.compute_totals(q).cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(module.compute_totals(strided).cpu(), expected, rtol=0, atol=0)


@pytest.mark.gpu
def test_the_simulator_and_the_gpu_agree_on_the_docs_closure_form(gpu_cache, launcher):
    """Case 3 of issue 26: globals local to the defining function, changed after the first
    call; CPU tensors (the simulator) and CUDA tensors give the same, original totals."""
    module = load("globals_constant")
    seed = fresh_seed()
    on_cpu, _ = module.run("cpu", seed)
    on_gpu, references = module.run("cuda", seed)
    for key in references:
        torch.testing.assert_close(on_gpu[key].cpu(), on_cpu[key], rtol=0, atol=0)
        torch.testing.assert_close(on_gpu[key].cpu(), references[key], rtol=0, atol=0)
