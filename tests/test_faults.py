"""The fault matrix: what must stay true when processes share the compile cache, get
killed at any moment, or find the cache folder unusable, and over long sessions.  This file:

* four processes compiling the same new kernel into one cache, three rounds: every
  result correct, one whole entry per kernel;
* a compile killed with SIGKILL at several moments (most of them inside the compile,
  which the test checks), and a store killed at every one of its file-system steps:
  the next run gives a correct result, and the cache never holds half an entry.

Killed builds: tests/test_faults_builds.py; unusable cache folders and resident memory:
tests/test_faults_folders_memory.py.

Each case runs in subprocesses (a kill must not take pytest down).  Sizes are small.  Each
test prints its figures (``pytest -s tests/test_faults*.py``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pnex_magic import cache

from faults_helpers import _check_whole_entries, _env, _results, _script


KERNEL = """
import os, sys, time, json
print("STARTED", flush=True)
import torch
from numba import cuda
import pnex_magic as pnex

K = float(sys.argv[1])

def define():
    @pnex.jit(n_threads="a.numel()")
    def fault_kernel(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * K
    return fault_kernel

def check(op, seed):
    a = torch.randn(37, generator=torch.Generator().manual_seed(seed))
    out = op(a)
    compiled = op.definition.compiled_if_available()
    return {
        "ok": bool(torch.equal(out, (a.double() * K).float())),
        "cubin": compiled is not None and bool(compiled.cubin),
        "registers": None if compiled is None or compiled.resources is None else compiled.resources.registers,
        "hit": compiled is not None and compiled.cache_hit,
        "key": None if compiled is None else compiled.key,
    }
"""

ONE_RUN = KERNEL + """
print("DEFINING", flush=True)
op = define()
print("DEFINED", flush=True)
print("RESULT " + json.dumps(check(op, 0)), flush=True)
"""

# Four workers meet at a file barrier before every round, so that they compile at once.
WORKER = KERNEL + """
worker, workers, rounds, sync = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
for r in range(rounds):
    open(os.path.join(sync, f"{r}-{worker}"), "w").close()
    deadline = time.time() + 240
    while sum(name.startswith(f"{r}-") for name in os.listdir(sync)) < workers:
        assert time.time() < deadline, "barrier timed out"
        time.sleep(0.005)
    K = float(sys.argv[1]) + r  # a new kernel every round
    record = check(define(), 100 * worker + r)
    print("RESULT " + json.dumps({"round": r, "worker": worker, **record}), flush=True)
"""


# ---------------------------------------------------------------- concurrent processes


@pytest.mark.slow
def test_four_processes_compile_one_new_kernel_into_one_cache(tmp_path, pnex_env):
    workers, rounds = 4, 3
    folder = tmp_path / "cache"
    sync = tmp_path / "sync"
    sync.mkdir()
    script = _script(tmp_path, "worker.py", WORKER)
    env = _env(pnex_env, folder)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), "3.25", str(w), str(workers), str(rounds), str(sync)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for w in range(workers)
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    records = [r for out, _ in outputs for r in _results(out)]
    assert len(records) == workers * rounds
    assert all(r["ok"] and r["cubin"] and r["registers"] for r in records), records
    entries = _check_whole_entries(folder)
    for r in range(rounds):
        keys = {rec["key"] for rec in records if rec["round"] == r}
        assert len(keys) == 1, keys  # every worker compiled (or loaded) the same kernel
        assert [e for e in entries if e.meta["key"] in keys] != []
    assert len(entries) == rounds  # one entry per kernel, nothing else
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary folders left
    hits = sum(r["hit"] for r in records)
    print(f"\n[faults] concurrent: {workers} processes x {rounds} rounds: {len(records)} correct results, "
          f"{hits} cache hits, {len(records) - hits} compiles, {len(entries)} entries")


# ---------------------------------------------------------------- killed compiles


def _kill_run(script: Path, env: dict, delay: float, after: str) -> tuple[str, list[str]]:
    """Run ``script`` and SIGKILL it ``delay`` seconds after it printed the line ``after``;
    returns how it ended and the markers it printed."""
    proc = subprocess.Popen([sys.executable, str(script), "7.5"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    markers = []
    for line in proc.stdout:
        markers.append(line.split()[0])
        if line.startswith(after):
            break
    time.sleep(delay)
    finished = proc.poll() is not None
    if not finished:
        os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=120)
    markers += [line.split()[0] for line in rest.splitlines() if line.strip()]
    return ("finished before the kill" if finished else f"killed after {markers[-1] if markers else 'nothing'}"), markers


@pytest.mark.slow
def test_compile_killed_at_any_moment_then_the_next_run_recovers(tmp_path, pnex_env):
    folder = tmp_path / "cache"
    env = _env(pnex_env, folder)
    script = _script(tmp_path, "one_run.py", ONE_RUN)
    # Timed from the run's own markers, not from its start (imports take 1 to 5 s on 2 busy
    # cores): importing, five points inside the compile and the store (a new kernel takes
    # about a second from DEFINING to DEFINED on 2 cores), and running the op.
    points = [(0.3, "STARTED"), (0.02, "DEFINING"), (0.08, "DEFINING"), (0.15, "DEFINING"), (0.25, "DEFINING"),
              (0.4, "DEFINING"), (0.0, "DEFINED")]
    rows, mid_compile = [], 0
    for delay, after in points:
        outcome, markers = _kill_run(script, env, delay, after)
        assert outcome != "finished before the kill", f"the run finished before the kill {delay} s after {after}"
        if after == "DEFINING":
            mid_compile += markers[-1] == "DEFINING"  # killed after DEFINING, before DEFINED
        if folder.exists():
            _check_whole_entries(folder)
        recovery = subprocess.run([sys.executable, str(script), "7.5"], env=env, capture_output=True, text=True,
                                  timeout=300)
        assert recovery.returncode == 0, recovery.stderr[-3000:]
        [result] = _results(recovery.stdout)
        assert result["ok"] and result["cubin"], result
        rows.append((f"{delay} s after {after or 'start'}", outcome, "hit" if result["hit"] else "compiled"))
        entries = _check_whole_entries(folder)
        assert [e.meta["key"] for e in entries] == [result["key"]]
        # Start the next point from an empty cache: every kill lands on a new compile.
        for path in folder.iterdir():
            shutil.rmtree(path)
    print("\n[faults] killed compiles (kill point | killed run | next run):")
    for row in rows:
        print("   ", " | ".join(row))
    assert mid_compile > len(points) // 2, f"only {mid_compile} of {len(points)} kills landed mid-compile: {rows}"


# A store in a process of its own, SIGKILLed at its N-th file-system step.  It loads
# cache.py alone (the module needs only the standard library), so that a step costs a
# few milliseconds and no fork of the (multithreaded) test process.
STORE_STEP = """
import importlib.util, json, os, shutil, signal, sys
from pathlib import Path

module_spec = importlib.util.spec_from_file_location("pnex_cache_alone", sys.argv[1])
cache = sys.modules["pnex_cache_alone"] = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(cache)
kill_at, key, version, cache_id, files = int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] or None, sys.argv[6]
steps = [0]

def counted(fn):
    def wrapper(*args, **kwargs):
        steps[0] += 1
        if steps[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args, **kwargs)
    return wrapper

for name in ("mkdir", "replace", "rename", "unlink", "rmdir", "open"):
    setattr(os, name, counted(getattr(os, name)))
Path.write_bytes = counted(Path.write_bytes)
Path.write_text = counted(Path.write_text)
shutil.rmtree = counted(shutil.rmtree)
cache.store(key, {"version": version}, json.loads(files), cache_id)
"""


def _files(version: str) -> dict[str, str]:
    return {"kernel.ptx": f"ptx of {version}\n" * 50, "kernel.cubin": version * 300, "link.log": version}


def _encoded(files: dict[str, str]) -> dict[str, bytes]:
    return {n: d.encode() for n, d in files.items()}


@pytest.mark.parametrize("cache_id", [None, "slot"], ids=["same-key-rewrite", "cache-id-eviction"])
def test_store_killed_at_every_step_leaves_a_whole_entry_or_none(fresh_cache, pnex_env, tmp_path, cache_id):
    old_key, new_key = "a" * 64, ("a" * 64 if cache_id is None else "b" * 64)
    script = _script(tmp_path, "store_step.py", STORE_STEP)
    env = _env(pnex_env, fresh_cache)
    outcomes = []
    for kill_at in range(1, 60):
        for path in list(fresh_cache.iterdir()):
            shutil.rmtree(path)
        assert cache.store(old_key, {"version": "old"}, _files("old"), cache_id) is not None
        child = subprocess.run(
            [sys.executable, str(script), cache.__file__, str(kill_at), new_key, "new", cache_id or "",
             json.dumps(_files("new"))],
            env=env, capture_output=True, text=True, timeout=60,
        )
        killed = child.returncode == -signal.SIGKILL
        assert killed or child.returncode == 0, child.stderr[-2000:]
        entries = _check_whole_entries(fresh_cache)
        assert len(entries) <= 1
        for entry in entries:  # whatever is visible holds all of one version's files
            version = entry.meta["version"]
            assert {n: (entry.path / n).read_bytes() for n in _files(version)} == _encoded(_files(version))
        found = {}
        for key in {old_key, new_key}:
            entry = cache.load(key, cache_id)
            if entry is not None:
                version = entry.meta["version"]
                assert {n: entry.read_bytes(n) for n in _files(version)} == _encoded(_files(version))
                found[key] = version
        if not killed:
            assert found.get(new_key) == "new"
            break
        outcomes.append(next(iter(found.values()), "none"))
    else:
        pytest.fail("the store never completed")
    print(f"\n[faults] store killed at each of its {kill_at - 1} steps ({cache_id or 'same key'}): "
          f"the slot then held {', '.join(outcomes)}; never part of an entry")
