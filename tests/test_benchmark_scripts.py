"""Every script in benchmarks/ starts on a machine without a GPU: ``--help`` parses its
arguments and exits 0 before anything looks for a GPU, so a broken import or a script
that checks for the GPU first fails here, in CI, and not on the GPU machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
_MAIN = re.compile(r"^if __name__ == [\"']__main__[\"']\s*:", re.MULTILINE)


def _scripts() -> list[Path]:
    """The scripts of benchmarks/ (files run as ``__main__``; libraries such as bench_common.py are not)."""
    return sorted(p for p in BENCHMARKS.glob("*.py") if _MAIN.search(p.read_text()))


def test_the_benchmark_scripts_are_found():
    names = {p.name for p in _scripts()}
    assert {"overhead.py", "workloads.py", "export_check.py"} <= names, names
    assert "bench_common.py" not in names


@pytest.mark.parametrize("script", _scripts(), ids=lambda p: p.name)
def test_help_exits_0_without_a_gpu(script, pnex_env):
    env = {**pnex_env, "CUDA_VISIBLE_DEVICES": ""}  # as on a CPU machine, even on the GPU machine
    run = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=300, cwd=BENCHMARKS.parent, env=env
    )
    assert run.returncode == 0, f"{script.name} --help exited {run.returncode}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert run.stdout.startswith(f"usage: {script.name}"), run.stdout[:500]


# What a script may import before it answers --help: the standard library only.
_BLOCK_HEAVY = """
import runpy, sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "numpy", "numba", "jax", "pnex_magic", "IPython"}:
            raise ImportError(f"{name} is not installed here (the test blocks it)")
        return None
sys.meta_path.insert(0, _Blocked())
sys.argv = [sys.argv[1], "--help"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("script", _scripts(), ids=lambda p: p.name)
def test_help_needs_neither_torch_nor_the_script_folder_on_the_path(script, tmp_path):
    """--help answers in an isolated interpreter (``-I``: no script folder on sys.path)
    where torch, numpy, numba, JAX and pnex cannot be imported: a reviewer's machine."""
    run = subprocess.run(
        [sys.executable, "-I", "-c", _BLOCK_HEAVY, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert run.returncode == 0, f"{script.name} --help exited {run.returncode}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert "usage:" in run.stdout, run.stdout[:500]
