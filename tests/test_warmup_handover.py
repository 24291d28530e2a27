"""``%load_ext``'s background warm-up and the cells run at once after it: no thread of
pnex imports Numba (or CUDA Python, llvmlite) beside the warm-up's import of them.

Two threads importing ``numba.cuda``'s modules deadlock on their module locks (the
package and ``numba.cuda.cudadrv`` import each other); Python breaks the deadlock by
failing one import, which leaves ``numba.cuda`` without its submodules' attributes for
the rest of the process.  That is how notebook 05 failed on CPU in CI: its set-up cell
ends with ``%pnex_doctor``, whose NVVM probe imported ``numba.cuda`` while the warm-up
did, and its first ``%%pnex`` cell failed with "module 'numba.cuda' has no attribute
'datamodel'".

Each case runs a notebook's first cells in a fresh process in which an import hook
slows the warm-up thread's imports of those packages (``SLOW_S`` each, about 1.5 s for
``numba.cuda``'s), so that a cell's import meets it mid-way whatever the machine's
speed, and records any import of them by another thread while the warm-up runs.  The
cells must succeed, with their results checked against PyTorch, and nothing may be
recorded.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SLOW_S = 0.01

PRELUDE = """
import importlib.abc, sys, threading, time

WATCHED = ("numba", "numba_cuda", "llvmlite", "cuda")
foreign = []

class Watch(importlib.abc.MetaPathFinder):
    # Called for a module not imported yet, by the thread that imports it.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in WATCHED:
            me = threading.current_thread()
            warm = next((t for t in threading.enumerate() if t.name == "pnex-warmup"), None)
            if me is warm:
                time.sleep(SLOW_S)  # the warm-up's import, slowed: another thread's meets it mid-way
            elif warm is not None and warm.is_alive():
                foreign.append(f"{me.name}: {name}")
        return None

sys.meta_path.insert(0, Watch())
import torch
from IPython.testing.globalipapp import start_ipython

ip = start_ipython()

def cell(source):
    result = ip.run_cell(source)  # not silent: IPython runs no pre_run_cell hooks for a silent cell
    if not result.success:
        print("FAILED", repr(result.error_in_exec or result.error_before_exec))
        raise SystemExit(3)
"""

MULADD = '''
%%pnex --n-threads result.size(1) --n-threads result.size(0) --args a, b, 0.5 --eager "lambda a, b, c: a * b + c"
def muladd(a: In("f32", (None, None)), b: In("f32", "a"), c: float, result: Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < result.shape[0] and x < result.shape[1]:
        result[y, x] = a[y, x] * b[y, x] + c
'''

CHECK = """
from pnex_magic import warmup
print("WARMUP", warmup.state().get("error"), warmup.state().get("steps"))
print("FOREIGN", foreign[:8], len(foreign))
"""

CASES = {
    # notebook 05's set-up cell: %load_ext, then %pnex_doctor (NVVM, nvJitLink) in the same cell
    "doctor": ["import torch\n%load_ext pnex_magic\n%pnex_doctor", "a = torch.randn(8, 8); b = torch.randn(8, 8)",
               MULADD, "torch.testing.assert_close(muladd(a, b, 0.5), a * b + 0.5)"],
    # 01_quickstart's: %load_ext, then at once a new kernel ("Run all")
    "new kernel": ["import torch\n%load_ext pnex_magic", "a = torch.randn(8, 8); b = torch.randn(8, 8)", MULADD,
                   "torch.testing.assert_close(muladd(a, b, 0.5), a * b + 0.5)"],
    # a cell of the user's that imports CUDA Python, which the warm-up imports with numba.cuda
    "CUDA Python": ["import torch\n%load_ext pnex_magic",
                    "from cuda.bindings import nvjitlink\nassert nvjitlink.version() >= (12, 0)"],
}


def test_cells_run_at_once_after_load_ext_never_import_beside_the_warmup(tmp_path, pnex_env):
    """The cases run side by side (a fresh process each: 6-8 s on two cores, most of it
    torch's import and the slowed warm-up)."""
    running = {}
    for number, (case, cells) in enumerate(CASES.items()):
        code = PRELUDE.replace("SLOW_S", repr(SLOW_S)) + "".join(f"cell({source!r})\n" for source in cells) + CHECK
        env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / f"cache{number}"))  # an empty cache: every kernel is new
        env.pop("PNEX_WARMUP", None)
        running[case] = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failures = []
    for case, process in running.items():
        out, _ = process.communicate(timeout=300)
        # The cells succeeded; no other thread imported Numba or CUDA Python beside the
        # warm-up; the warm-up ran (its import at least) and failed nowhere.
        if process.returncode != 0 or "FOREIGN [] 0" not in out or "WARMUP None {'import numba.cuda'" not in out:
            failures.append(f"--- {case} (exit {process.returncode}):\n{out[-3000:]}")
    assert not failures, "\n".join(failures)


def test_the_lazy_cuda_module_takes_over_from_a_running_warmup(monkeypatch):
    """A cell's ``cuda.X`` (pnex's lazy ``numba.cuda``) while the warm-up runs: it takes
    over first, though ``numba.cuda`` is in sys.modules (as it is, half initialised,
    while the warm-up imports it)."""
    import threading

    from numba import cuda as numba_cuda

    from pnex_magic import warmup
    from pnex_magic.lazycuda import cuda

    release = threading.Event()
    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setattr(warmup, "_warm", lambda: release.wait(30))  # a warm-up step that runs until released
    thread = warmup.start()
    try:
        assert thread.is_alive() and "numba.cuda" in sys.modules
        threading.Timer(0.3, release.set).start()
        grid = cuda.grid
        assert not thread.is_alive()  # waited for the step under way
        assert grid is numba_cuda.grid
    finally:
        release.set()
        thread.join(30)
