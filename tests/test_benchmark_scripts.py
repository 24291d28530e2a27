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
