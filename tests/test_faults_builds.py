"""The fault matrix, killed builds: a kill during the one-time C++ extension build (checked
to land in it), of the process waiting for it (the build process finishes it) or of the build
process itself (the next run builds again), and processes starting the same build at once (one
build).

Each case runs in subprocesses (a kill must not take pytest down).  Sizes are small.  Each
test prints its figures (``pytest -s tests/test_faults*.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pnex_magic.launch import background

from faults_helpers import PROBE_SOURCE, _env, _script


# ---------------------------------------------------------------- killed extension build


PROBE_BUILD = """
import sys
from pathlib import Path
from pnex_magic.launch import background
print("STARTED", flush=True)
module = background.build_extension("pnex_probe", [Path(sys.argv[1])], includes=[], what="probe extension")
print("RESULT", module.add(2, 3), flush=True)
"""

LAUNCHER_BUILD = """
import sys
print("STARTED", flush=True)
from pnex_magic.launch import native
module = native.load_launcher()
print("RESULT", 5 if callable(module.register_op) else 0, flush=True)
"""


def _start_and_kill(script: Path, args: list[str], env: dict, delay: float, *, build_process: bool) -> str:
    """Run ``script``, and ``delay`` seconds into its build SIGKILL it, and with
    ``build_process`` the build process with everything it started (its session)."""
    folder = Path(env["PNEX_CACHE_DIR"])
    proc = subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "building the" in line:
                break
        time.sleep(delay)
        builders = background.processes(folder)
        finished = proc.poll() is not None or not builders
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        if build_process:
            for pid in builders:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # the build process, ninja and the compilers
    finally:
        proc.stderr.close()
    return "finished first" if finished else "killed"


def _killed_build_then_recovery(tmp_path, pnex_env, script_text, args, kill_after_s):
    """Kill the build at each of ``kill_after_s``: the process waiting for it alone (the
    build process goes on and the next run finds it built; a cache folder per kill), or
    the build process too, one kill after another in one cache folder (the next run
    builds again).  Every kill must land in the build."""
    script = _script(tmp_path, "build.py", script_text)
    rows = []
    runs = [(f"cache-waiting-{delay}", [delay], False) for delay in kill_after_s]
    runs.append(("cache-build", kill_after_s, True))
    for name, delays, build_process in runs:
        folder = tmp_path / name
        env = _env(pnex_env, folder)
        for delay in delays:
            outcome = _start_and_kill(script, args, env, delay, build_process=build_process)
            assert outcome == "killed", f"the build finished before the kill {delay} s into it"
            rows.append(f"{delay} s into the build, {'the build process' if build_process else 'the waiting process'} "
                        f"killed")
        deadline = time.monotonic() + 600
        while background.processes(folder) and time.monotonic() < deadline:  # a build process going on: to its end
            time.sleep(0.2)
        recovery = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                                  timeout=900)
        assert recovery.returncode == 0, recovery.stderr[-3000:]
        assert "RESULT 5" in recovery.stdout
        built_again = "building the" in recovery.stderr
        assert built_again == build_process, recovery.stderr[-2000:]
        rows.append("the next run " + ("built it again" if built_again else "found it built by the build process"))
        again = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0 and "RESULT 5" in again.stdout and "building" not in again.stderr
        assert not [p for p in (folder / "launcher").iterdir() if p.name.startswith(".")]  # leftovers removed
    return rows


@pytest.mark.slow
def test_kill_during_the_one_time_extension_build(tmp_path, pnex_env):
    """The code that builds the C++ launcher once per environment
    (:mod:`pnex_magic.launch.background`), on a small extension that builds without a GPU."""
    source = tmp_path / "probe.cpp"
    source.write_text(PROBE_SOURCE)
    rows = _killed_build_then_recovery(tmp_path, pnex_env, PROBE_BUILD, [str(source)], [0.3, 2.0])
    print("\n[faults] extension build:", "; ".join(rows), "; the run after that reused it")


@pytest.mark.gpu
def test_kill_during_the_launcher_build(tmp_path, pnex_env):
    rows = _killed_build_then_recovery(tmp_path, pnex_env, LAUNCHER_BUILD, [], [0.3, 3.0])
    print("\n[faults] launcher build:", "; ".join(rows))


# Processes that meet at a file barrier, then build the same extension at once.
AT_ONCE = """
import os, sys, time
from pathlib import Path
from pnex_magic.launch import background
worker, workers, sync, source = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
open(os.path.join(sync, str(worker)), "w").close()
while len(os.listdir(sync)) < workers:
    time.sleep(0.002)
module = background.build_extension("pnex_tiny", [source], includes=[], what="test extension")
print("RESULT", module.__name__, flush=True)
"""

TINY_SOURCE = r"""
#include <Python.h>
#define PNEX_STR2(x) #x
#define PNEX_STR(x) PNEX_STR2(x)
#define PNEX_CAT2(a, b) a##b
#define PNEX_CAT(a, b) PNEX_CAT2(a, b)
static PyModuleDef tiny = {PyModuleDef_HEAD_INIT, PNEX_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
PyMODINIT_FUNC PNEX_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&tiny); }
"""


@pytest.mark.slow
def test_processes_starting_at_once_build_once(tmp_path, pnex_env):
    """Three processes that need the same extension at the same moment: one build, three
    imports of the same whole library, nothing left behind."""
    workers = 3
    folder = tmp_path / "cache"
    sync = tmp_path / "sync"
    sync.mkdir()
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    script = _script(tmp_path, "at_once.py", AT_ONCE)
    procs = [subprocess.Popen([sys.executable, str(script), str(w), str(workers), str(sync), str(source)],
                              env=_env(pnex_env, folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(workers)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    names = {out.split("RESULT ", 1)[1].split()[0] for out, _ in outputs}
    assert len(names) == 1
    root = folder / "launcher"
    [log] = root.glob("*.log")
    assert log.read_text().count("pnex: building the test extension") == 1  # one build
    assert len([p for p in root.iterdir() if p.is_dir()]) == 1
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    print(f"\n[faults] {workers} processes at once: one build, {sum('building' in e for _, e in outputs)} of them "
          f"said it was building (they waited for it)")
