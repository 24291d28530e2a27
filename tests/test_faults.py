"""The fault matrix: what must stay true when processes share the compile cache, get
killed at any moment, or find the cache folder unusable, and over long sessions.

* four processes compiling the same new kernel into one cache, three rounds: every
  result correct, one whole entry per kernel;
* a compile killed with SIGKILL at several moments (most of them inside the compile,
  which the test checks), and a store killed at every one of its file-system steps:
  the next run gives a correct result, and the cache never holds half an entry;
* a kill during the one-time C++ extension build (checked to land in it), of the
  process waiting for it (the build process finishes it) or of the build process
  itself (the next run builds again), and processes starting the same build at
  once (one build);
* a read-only cache folder, and one whose parent does not exist: kernels compile
  and run, the first says once why nothing is cached;
* 300 definitions and 100,000 calls in one process: resident memory grows by a
  bounded amount per definition and not at all per call.

Each case runs in subprocesses (a kill must not take pytest down).  Sizes are small:
on two cores the whole file takes about two minutes.  Each test prints its figures
(``pytest -s tests/test_faults.py``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelCompileError, cache
from pnex_magic.launch import background

# One kernel whose constant K makes it new (its own cache key) in every case.
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


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _env(pnex_env: dict, cache_folder: Path) -> dict:
    return dict(pnex_env, PNEX_CACHE_DIR=str(cache_folder))


def _results(stdout: str) -> list[dict]:
    return [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]


def _check_whole_entries(folder: Path) -> list[cache.CacheEntry]:
    """Every visible entry of ``folder`` is whole: meta.json names its key and every
    file it lists is there.  Returns them."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name in cache.PARTS:  # not entries: the other parts of the cache
            continue
        meta = json.loads((path / "meta.json").read_text())
        assert len(meta["key"]) == 64, path
        for name in meta["files"]:
            assert (path / name).is_file() and (path / name).stat().st_size > 0, (path, name)
        found.append(cache.CacheEntry(path, meta))
    return found


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


# ---------------------------------------------------------------- killed extension build

# Built by the same code as the launcher (torch's cpp_extension and ninja under pnex's
# lock), but small: pybind11 alone compiles in seconds where torch's headers take a minute.
PROBE_SOURCE = """
#include <pybind11/pybind11.h>
int add(int a, int b) { return a + b; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add", &add); }
"""

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


# ---------------------------------------------------------------- unusable cache folders


def _read_only_folder(tmp_path: Path) -> Path:
    """An existing folder this process cannot write into."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    candidates = [folder, Path("/sys/kernel"), Path("/proc/self/fdinfo")]  # root ignores permission bits
    for candidate in candidates:
        try:
            (candidate / ".pnex-probe").mkdir()
        except OSError:
            return candidate
        (candidate / ".pnex-probe").rmdir()
    pytest.fail("found no folder that cannot be written")


def _define_new_kernel(k: float):
    @pnex.jit(n_threads="a.numel()")
    def uncached(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] - k

    return uncached


def test_read_only_cache_folder_compiles_runs_and_says_why(tmp_path, monkeypatch, caplog):
    folder = _read_only_folder(tmp_path)
    before = sorted(p.name for p in folder.iterdir())
    monkeypatch.setenv("PNEX_CACHE_DIR", str(folder))
    monkeypatch.setattr(cache, "_warned_unwritable", set())
    a = torch.randn(9)
    with caplog.at_level(logging.WARNING, logger="pnex_magic.cache"):
        for k in (0.5, 1.5):
            op = _define_new_kernel(k)
            torch.testing.assert_close(op(a), a - k)
            assert pnex.inspect(op).cache_hit is False
    warnings = [r.getMessage() for r in caplog.records if r.name == "pnex_magic.cache"]
    assert len(warnings) == 1, warnings  # said once, not per kernel
    assert f"the compile cache folder {folder} cannot be written" in warnings[0]
    assert "PNEX_CACHE_DIR" in warnings[0]
    assert sorted(p.name for p in folder.iterdir()) == before
    # The C++ launcher's one-time build says the same instead of failing obscurely.
    source = tmp_path / "probe.cpp"
    source.write_text(PROBE_SOURCE)
    with pytest.raises(KernelCompileError, match=rf"build folder {re.escape(str(folder))}/launcher/\S+ cannot be written"):
        background.build_extension("pnex_probe", [source], includes=[], what="probe extension")


def test_cache_folder_whose_parent_does_not_exist_is_created(tmp_path, monkeypatch):
    folder = tmp_path / "not" / "yet" / "there" / "cache"
    monkeypatch.setenv("PNEX_CACHE_DIR", str(folder))
    a = torch.randn(6)
    op = _define_new_kernel(2.5)
    torch.testing.assert_close(op(a), a - 2.5)
    [entry] = _check_whole_entries(folder)
    assert entry.meta["key"] == pnex.inspect(op).cache_key
    again = _define_new_kernel(2.5)
    assert pnex.inspect(again).cache_hit is True
    torch.testing.assert_close(again(a), a - 2.5)


# ---------------------------------------------------------------- resident memory

MEMORY = """
import gc, json, os, sys, weakref
import torch
from numba import cuda
import pnex_magic as pnex

device, definitions, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

def define(k):
    @pnex.jit(n_threads="a.numel()")
    def memory_kernel(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * k
    return memory_kernel

# Empty tensors on CPU: the op's whole Python path runs, the (slow) simulator launches nothing.
a = torch.randn(4096, device=device) if device == "cuda" else torch.empty(0)
def sync():
    if device == "cuda":
        torch.cuda.synchronize()

warm = 20
first = []
for k in range(warm):
    op = define(float(k))
    op(a)
    first.append(weakref.ref(op))
del op
sync(); gc.collect()
before = rss_mb()
for k in range(warm, warm + definitions):
    op = define(float(k))  # a new kernel each time: compiled, registered, called once
    out = op(a)
    assert out.shape == a.shape
sync(); gc.collect()
after_definitions = rss_mb()
if device == "cuda":
    torch.testing.assert_close(op(a), a * float(warm + definitions - 1))
for _ in range(10_000):
    op(a)
sync(); gc.collect()
before_calls = rss_mb()
for i in range(calls):
    op(a)
    if i % 10_000 == 0:
        sync()
sync(); gc.collect()
after_calls = rss_mb()
print("RESULT " + json.dumps({
    "mb_per_definition": (after_definitions - before) / definitions,
    "mb_per_100k_calls": (after_calls - before_calls) * 100_000 / calls,
    "rss_mb": after_calls,
    "earlier_objects_alive": sum(r() is not None for r in first),
    "launcher": "native" if getattr(op, "_native", False) else "python",
}), flush=True)
"""


def _memory(tmp_path, pnex_env, device: str) -> dict:
    script = _script(tmp_path, "memory.py", MEMORY)
    proc = subprocess.run([sys.executable, str(script), device, "300", "100000"],
                          env=_env(pnex_env, tmp_path / "cache"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [figures] = _results(proc.stdout)
    print(f"\n[faults] memory ({device}): " + ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    return figures


@pytest.mark.slow
def test_resident_memory_stays_flat_over_definitions_and_calls(tmp_path, pnex_env):
    figures = _memory(tmp_path, pnex_env, "cpu")
    assert figures["mb_per_definition"] < 0.5  # measured about 0.05 MB on CPU
    assert figures["mb_per_100k_calls"] < 4.0  # measured 0


@pytest.mark.gpu
def test_resident_memory_stays_flat_through_the_cpp_launcher(tmp_path, pnex_env):
    figures = _memory(tmp_path, pnex_env, "cuda")
    assert figures["launcher"] == "native"
    assert figures["mb_per_definition"] < 1.0
    assert figures["mb_per_100k_calls"] < 4.0
