"""tests/conftest.py on a machine where CUDA does not work: gpu tests are skipped, unless
``PNEX_EXPECT_GPU=1`` says a GPU is expected (benchmarks/gpu_tests.sh), where each one
fails with what CUDA said.  Runs pytest on a probe file beside a copy of the conftest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = '''
import pytest
import torch

if BROKEN:
    def broken():
        raise RuntimeError("CUDA driver initialization failed, you might not have a CUDA gpu.")
    torch.cuda.is_available = broken


@pytest.mark.gpu
def test_on_the_gpu():
    pass


def test_on_the_cpu():
    pass
'''


def _run_probe(tmp_path: Path, env: dict, *, broken: bool, expect: str | None) -> subprocess.CompletedProcess:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE.replace("BROKEN", str(broken)))
    env = {**env, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on the GPU machine
    env.pop("PNEX_EXPECT_GPU", None)
    if expect is not None:
        env["PNEX_EXPECT_GPU"] = expect
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
         str(tmp_path / "test_probe.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.parametrize("broken", [False, True], ids=["no-gpu", "cuda-raises"])
def test_gpu_tests_are_skipped_where_no_gpu_is_expected(tmp_path, pnex_env, broken):
    run = _run_probe(tmp_path, pnex_env, broken=broken, expect=None)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 1 skipped" in run.stdout and "needs an NVIDIA GPU" in run.stdout


@pytest.mark.parametrize("broken", [False, True], ids=["no-gpu", "cuda-raises"])
def test_gpu_tests_fail_with_the_reason_where_a_gpu_is_expected(tmp_path, pnex_env, broken):
    run = _run_probe(tmp_path, pnex_env, broken=broken, expect="1")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed, 1 error" in run.stdout, run.stdout  # fails at set-up: an error
    said = (
        "torch.cuda.is_available() raised RuntimeError: CUDA driver initialization failed" if broken
        else "torch.cuda.is_available() is False"
    )
    assert f"PNEX_EXPECT_GPU=1 but no usable GPU: {said}" in run.stdout, run.stdout
