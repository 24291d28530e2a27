"""Run Python in a subprocess where the CUDA compiler stack cannot be imported.

``run_blocked(script)`` runs ``script`` in a fresh interpreter whose first act is to
put a finder on ``sys.meta_path`` that refuses Numba, numba-cuda, llvmlite, NVVM
and nvJitLink (``block_nvjitlink=False`` lets nvJitLink through), as a production
machine with torch and pnex_magic's launcher alone would.  The script can ``print``
what the test checks; ``BLOCKED_NAMES`` lists what is refused and
``imported_blocked()`` what was imported anyway or tried by pnex_magic (torch's own
optional imports are not pnex's to answer for).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

COMPILER_STACK = ("numba", "numba_cuda", "llvmlite", "nvvm", "cuda.bindings.nvvm", "cuda.bindings.cynvvm")
NVJITLINK = ("nvjitlink", "cuda.bindings.nvjitlink", "cuda.bindings.cynvjitlink")

_PRELUDE = """
import sys

class _Blocker:
    def __init__(self, names):
        self.names = names
        self.attempts = []

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in self.names):
            frame = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
                frame = frame.f_back
            self.attempts.append((name, frame.f_globals.get("__name__", "?") if frame is not None else "?"))
            raise ImportError(f"{name} is blocked in this test")
        return None

BLOCKED_NAMES = tuple(__BLOCKED__)
_BLOCKER = _Blocker(BLOCKED_NAMES)
sys.meta_path.insert(0, _BLOCKER)


def imported_blocked():
    # blocked modules imported anyway, or tried by pnex_magic (an attempt the code caught);
    # what torch itself tries and does without is its own business
    imported = [m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED_NAMES)]
    tried = [f"{name} (by {who})" for name, who in _BLOCKER.attempts if who.startswith("pnex_magic")]
    return sorted(set(imported) | set(tried))
"""


def run_blocked(
    script: str, env: dict[str, str], *, block_nvjitlink: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run ``script`` (dedented) with the compiler stack blocked; raises with the
    subprocess's output if it fails."""
    names = COMPILER_STACK + (NVJITLINK if block_nvjitlink else ())
    code = _PRELUDE.replace("__BLOCKED__", json.dumps(list(names))) + textwrap.dedent(script)
    result = subprocess.run(
        # faulthandler and unbuffered output: a crash still says where it happened
        [sys.executable, "-X", "faulthandler", "-u", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result
