"""What the first-use tests share (tests/test_fastloop.py, tests/test_fastloop_warmup.py): ``run``,
which runs code in a fresh Python process and fails with its output if it fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, f"subprocess failed:\n{result.stdout}\n{result.stderr}"
    return result
