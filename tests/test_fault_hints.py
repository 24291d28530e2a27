"""Where CUDA's report of a faulting kernel surfaces, pnex names the kernel that ran last.

Without a GPU the report is faked: a ``torch.AcceleratorError`` with CUDA's text, and
the launchers' record of the last kernel per device.  tests/test_gpu_surfaces.py does
the same with a kernel that really faults.
"""

from __future__ import annotations

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import launch
from pnex_magic.launch import driver as driver_launch
from pnex_magic.launch import faults

IPython = pytest.importorskip("IPython")
from IPython.testing import globalipapp  # noqa: E402

AcceleratorError = getattr(torch, "AcceleratorError", None)
needs_accelerator_error = pytest.mark.skipif(AcceleratorError is None, reason="torch < 2.8 has no AcceleratorError")
ILLEGAL = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported"


@pytest.fixture
def ran_on_gpu(monkeypatch):
    """As if this process had launched 'bad_k' on cuda:1 and nothing on cuda:0."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(launch, "last_kernel", lambda i: {1: "bad_k"}.get(i, ""))


def test_fault_texts_and_blocking_settings(monkeypatch):
    assert faults.is_fault(ILLEGAL) and faults.is_fault("launch failed with CUDA_ERROR_ILLEGAL_ADDRESS")
    assert not faults.is_fault("CUDA error: out of memory") and not faults.is_fault("CUDA error: invalid device ordinal")
    for var in ("PNEX_LAUNCH_BLOCKING", "CUDA_LAUNCH_BLOCKING"):
        monkeypatch.delenv("PNEX_LAUNCH_BLOCKING", raising=False)
        monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
        assert not faults.launch_blocking()
        monkeypatch.setenv(var, "1")
        assert faults.launch_blocking(), var


SENTENCE = (
    "The CUDA context is lost after a kernel fault (restart the Python process, the notebook's kernel, to use the "
    "GPU again); the last pnex kernel launched was 'bad_k' on cuda:1, and `%%pnex --check` or `%%pnex --sanitize` "
    "on the kernel's cell (outside a notebook, `jit(check=True)` or PNEX_CHECK=1) finds the line at fault."
)


def test_hint_names_the_last_kernel_per_device(ran_on_gpu):
    hint = launch.fault_hint()
    assert hint == SENTENCE + " " + faults.BLOCKING_HINT
    assert "PNEX_LAUNCH_BLOCKING=1 (or CUDA_LAUNCH_BLOCKING=1)" in hint and "restart" in hint


def test_the_fault_sentence_is_one_sentence_with_all_three_facts():
    sentence = faults.fault_sentence("bad_k")
    first = sentence.split(". ")[0]
    assert "'bad_k'" in first and "context is lost" in first and "--check" in first and "--sanitize" in first
    assert "jit(check=True)" in first and "PNEX_CHECK=1" in first and first.count(".") == 0
    two = faults.fault_sentence(["'a' on cuda:0", "'b' on cuda:1"])
    assert "the last pnex kernel launched were 'a' on cuda:0 and 'b' on cuda:1," in two
    assert faults.fault_sentence([]) == "" and faults.fault_sentence("") == ""
    assert faults.BLOCKING_HINT in faults.BLOCKING_ADVICE and faults.CHECK_HINT in faults.BLOCKING_ADVICE
    assert "restart" in faults.BLOCKING_ADVICE


def test_no_hint_when_no_pnex_kernel_ran(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(launch, "last_kernel", lambda i: "")
    assert launch.fault_hint() == ""


def test_the_driver_launcher_remembers_its_last_kernel():
    launcher = driver_launch.DriverLauncher()
    assert launcher.last_kernel(0) == ""
    launcher._last[0] = "k"
    assert launcher.last_kernel(0) == "k" and launcher.last_kernel(1) == ""


@needs_accelerator_error
def test_an_op_call_that_meets_a_fault_raises_kernel_launch_error(ran_on_gpu, monkeypatch):
    @pnex.jit(n_threads="a.numel()")
    def after_fault(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    def raise_fault(*args):
        raise AcceleratorError(ILLEGAL)

    monkeypatch.setattr(after_fault, "_call", raise_fault)  # where a call enters the dispatcher
    with pytest.raises(pnex.KernelLaunchError) as info:
        after_fault(torch.ones(4))
    text = str(info.value)
    assert text.startswith("after_fault(): CUDA reported at this call: CUDA error: an illegal memory access")
    assert "'bad_k' on cuda:1" in text and "PNEX_LAUNCH_BLOCKING=1" in text and "--check" in text
    monkeypatch.setattr(after_fault, "_call", lambda *a: (_ for _ in ()).throw(AcceleratorError("CUDA error: x")))
    with pytest.raises(AcceleratorError):  # other CUDA errors pass through unchanged
        after_fault(torch.ones(4))


@needs_accelerator_error
def test_ipython_shows_torchs_error_and_names_the_last_kernel(ran_on_gpu, capsys):
    ip = globalipapp.get_ipython()  # the module's name: rebound to the shell once started
    ip.run_line_magic("reload_ext", "pnex_magic")  # loaded now, whatever other tests did
    assert ip.custom_exceptions == (AcceleratorError,)
    result = ip.run_cell(f"import torch\nraise torch.AcceleratorError({ILLEGAL!r})")
    assert isinstance(result.error_in_exec, AcceleratorError)
    out = capsys.readouterr().out
    assert "AcceleratorError" in out and "an illegal memory access was encountered" in out
    assert "pnex: " + SENTENCE in out
    ip.run_cell("import torch\nraise torch.AcceleratorError('CUDA error: invalid device ordinal')")
    out = capsys.readouterr().out
    assert "invalid device ordinal" in out and "pnex:" not in out  # not a fault: torch's error alone
    ip.run_line_magic("unload_ext", "pnex_magic")
    assert ip.custom_exceptions == ()
    ip.run_line_magic("load_ext", "pnex_magic")
    assert ip.custom_exceptions == (AcceleratorError,)
