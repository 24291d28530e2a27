"""GPU: what a user's process prints and raises.

* A fresh process that defines and runs a pnex op prints only the user's output: no
  "Overriding a previously registered kernel" warning (torch < 2.12 registers its
  Python autograd kernel before the C++ launcher's), no other warning, and no PTX
  JIT-compilation (``CUDA_DISABLE_PTX_JIT=1``: kernels load from cubins).
* A kernel that faults is named: at the next pnex call, in ``build_report`` / a
  ``%%pnex`` cell, and in IPython when PyTorch reports the fault (``out.cpu()``),
  without ``PNEX_LAUNCH_BLOCKING``; at its launch with ``PNEX_LAUNCH_BLOCKING=1`` or
  ``CUDA_LAUNCH_BLOCKING=1``.

Each case runs in its own process (a fault leaves the CUDA context unusable).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

QUIET = textwrap.dedent(
    """
    import os
    import torch
    import pnex_magic as pnex
    from numba import cuda

    K = float(os.environ["PNEX_TEST_K"])  # a new value: a new kernel to compile

    @pnex.jit(n_threads="a.numel()")
    def quiet_scale(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * K

    x = torch.arange(4096, dtype=torch.float32, device="cuda")
    torch.testing.assert_close(quiet_scale(x), x * K)
    print("the user's output")
    """
)

BAD = """
import torch
import pnex_magic as pnex
from numba import cuda

@pnex.jit(n_threads="a.numel()")
def out_of_bounds(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i + (1 << 40)] = a[i]

@pnex.jit(n_threads="a.numel()")
def harmless(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i]

x = torch.ones(1024, device="cuda")
"""


def _run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args, "-c", code], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("launcher", ["native", "driver", "auto"])
def test_a_fresh_process_prints_only_the_users_output(pnex_env, launcher, tmp_path):
    env = dict(pnex_env, PNEX_LAUNCHER=launcher, CUDA_DISABLE_PTX_JIT="1")
    if launcher == "auto":  # a fresh environment: the C++ launcher builds in the background, unsaid
        env["PNEX_CACHE_DIR"] = str(tmp_path / "cache")
    env.pop("PYTHONWARNINGS", None)  # Python's default warning filters, as a user has them
    env.pop("PNEX_LAUNCH_BLOCKING", None)
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    warm = _run(QUIET, dict(env, PNEX_TEST_K="1.5"))  # may build the C++ launcher (once per environment)
    assert warm.returncode == 0, warm.stdout + warm.stderr
    first = _run(QUIET, dict(env, PNEX_TEST_K="2.5"))  # a kernel never compiled before, in a fresh process
    assert first.returncode == 0, first.stderr
    assert first.stdout == "the user's output\n"
    assert first.stderr == "", first.stderr


@pytest.mark.parametrize("launcher", ["native", "driver"])
def test_a_fault_is_named_at_the_next_call_without_blocking(pnex_env, launcher):
    code = BAD + textwrap.dedent(
        """
        out_of_bounds(x)
        print("LAST", pnex.launch.last_kernel(0))
        try:
            torch.cuda.synchronize()  # where PyTorch reports the fault
        except RuntimeError as exc:
            print("TORCH", type(exc).__name__)
        try:
            harmless(x)  # the next pnex call meets the same error
        except pnex.KernelLaunchError as exc:
            print("CAUGHT", exc)
        except Exception as exc:
            print("OTHER", type(exc).__name__, exc)
        """
    )
    env = dict(pnex_env, PNEX_LAUNCHER=launcher)
    env.pop("PNEX_LAUNCH_BLOCKING", None)
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    done = _run(code, env)
    assert "LAST out_of_bounds" in done.stdout, done.stdout + done.stderr
    caught = next((line for line in done.stdout.splitlines() if line.startswith("CAUGHT")), "")
    assert "out_of_bounds" in caught and "PNEX_LAUNCH_BLOCKING=1" in caught, done.stdout + done.stderr


@pytest.mark.parametrize("setting", ["PNEX_LAUNCH_BLOCKING", "CUDA_LAUNCH_BLOCKING"])
@pytest.mark.parametrize("launcher", ["native", "driver"])
def test_with_blocking_the_faulting_kernel_is_named_at_its_launch(pnex_env, launcher, setting):
    code = BAD + textwrap.dedent(
        """
        try:
            out_of_bounds(x)
            print("NOT RAISED")
        except pnex.KernelLaunchError as exc:
            print("CAUGHT", exc)
        """
    )
    env = dict(pnex_env, PNEX_LAUNCHER=launcher, **{setting: "1"})
    done = _run(code, env)
    assert done.stdout.startswith("CAUGHT") and "'out_of_bounds'" in done.stdout, done.stdout + done.stderr


def test_ipython_names_the_kernel_when_torch_reports_the_fault(pnex_env):
    code = (
        "get_ipython().run_line_magic('load_ext', 'pnex_magic')\n" + BAD
        + "y = out_of_bounds(x)\nprint(y.cpu().sum())\n"
    )
    env = dict(pnex_env)
    env.pop("PNEX_LAUNCH_BLOCKING", None)
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    done = _run(code, env, "-m", "IPython", "--no-banner", "--colors=nocolor", "--HistoryManager.enabled=False")
    text = done.stdout + done.stderr
    assert "AcceleratorError" in text and "illegal memory access" in text, text
    assert "the last pnex kernel launched was 'out_of_bounds' on cuda:0" in text and "--check" in text, text


def test_a_pnex_cell_whose_kernel_writes_out_of_bounds_on_its_arguments(pnex_env):
    """The magic's first run on --args is a checked launch: the write is named, never
    made, and the CUDA context survives (the next GPU call works)."""
    cell = (
        "def oob_cell(a: In('f32', (None,)), out: Out('f32', 'a')):\n"
        "    i = cuda.grid(1)\n"
        "    if i < a.shape[0]:\n"
        "        out[i + (1 << 40)] = a[i]\n"
    )
    code = (
        "import torch\nimport pnex_magic as pnex\nip = get_ipython()\nip.run_line_magic('load_ext', 'pnex_magic')\n"
        "x = torch.ones(1024, device='cuda')\n"
        "try:\n"
        f"    ip.run_cell_magic('pnex', '--n-threads a.numel() --args (x,)', {cell!r})\n"
        "except pnex.KernelIndexError as exc:\n"
        "    print('CAUGHT', exc)\n"
        "print('AFTER', torch.ones(4, device='cuda').sum().item())\n"
    )
    env = dict(pnex_env)
    env.pop("PNEX_LAUNCH_BLOCKING", None)
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    done = _run(code, env, "-m", "IPython", "--no-banner", "--colors=nocolor", "--HistoryManager.enabled=False")
    assert re.search(r"CAUGHT cell line 1 \(the %%pnex line\): --args \(x,\): oob_cell\(\): index 1099511\d{6} ",
                     done.stdout), done.stdout + done.stderr  # i + (1 << 40)
    assert "of parameter 'out' (shape (1024,)), at line 5: `out[i + (1 << 40)] = a[i]`" in done.stdout
    assert "AFTER 4.0" in done.stdout
