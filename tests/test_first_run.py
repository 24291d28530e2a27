"""The first run in a fresh environment (issue 27): ops serve at once through the Python
launcher while the C++ launcher builds in a background process, and move onto it when
it is built, in the same process.

Without a GPU, the real C++ launcher is built against the CPU build of torch with two
stand-ins (``tests/launcher_stand_in.py``) and registered as on a GPU machine; CPU
calls then cross its autograd kernels, so the switch of live ops is tested here: ops
defined before it (a functional one with a backward attached, one with an ``InMut``,
an autotuned one) give the same results after it, a function ``torch.compile``
compiled before it keeps working without a recompile, the op object's call goes to
the C call slot, torch prints no "overriding" warning, and calls on other threads
while it happens all succeed.  And where it cannot be built (no compiler, no
headers, a failed build, a cache folder that cannot be written) one note says why and
the ops keep working; a launcher shipped in the package is used without a build.

Each case runs in fresh processes (registrations are per process).  The real
launcher takes 15 to 50 s to build on two shared cores: it is built twice per session
(once by two processes at once, once for the other cases).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import launcher_stand_in
from first_run_child import ENTERED_PYTHON_CALL

pytestmark = pytest.mark.slow

PRELUDE = """
import json, logging, os, sys, threading, time, warnings
logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s", stream=sys.stdout)
import torch
from numba import cuda
import pnex_magic as pnex
from pnex_magic.launch import background, native, switch

def dump(op):
    return torch._C._dispatch_dump(f"pnex::{op.definition.op_name}")

def cuda_kernel(op):
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"pnex::{op.definition.op_name}", "CUDA")

@pnex.jit(n_threads="a.numel()")
def scale(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * 2.0 + 1.0
"""

OPS = PRELUDE + """
@pnex.jit(n_threads="a.numel()")
def square(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * a[i]

@pnex.backward_of(square)
@pnex.jit(n_threads="a.numel()")
def square_backward(a: pnex.In("f32", (None,)), grad_out: pnex.In("f32", "a"), grad_a: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        grad_a[i] = 2.0 * a[i] * grad_out[i]

@pnex.jit(n_threads="a.numel()")
def bump(a: pnex.InMut("f32", (None,)), by: float):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] += by

@pnex.jit(n_threads="(a.numel() + ITEMS - 1) // ITEMS", threads_per_block=[32, 64])
def tuned(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a"), ITEMS: pnex.Tune(1, 2)):
    base = cuda.grid(1) * ITEMS
    for k in range(ITEMS):
        if base + k < a.shape[0]:
            out[base + k] = a[base + k] - 3.0

ops = [scale, square, square_backward, bump, tuned]

def results(seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(37, generator=g)
    x = a.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(square(x).sum(), x)
    b = a.clone()
    with torch.no_grad():
        bump(b, 0.5)
    try:
        bump(x, 1.0)
        refused = None
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"[:60]
    return a, {
        "scale": torch.equal(scale(a), (a.double() * 2 + 1).float()),
        "square": torch.equal(square(a), a * a),
        "grad": torch.equal(grad, 2 * a),
        "bump": torch.equal(b, a + 0.5),
        "tuned": torch.equal(tuned(a), a - 3),
        "refused": refused,
    }
"""
OPS += ENTERED_PYTHON_CALL

SWITCH = OPS + """
before = {"native": [op._native for op in ops], "cuda": [cuda_kernel(op) for op in ops], "status": switch.status()}
a, before["results"] = results(0)
compiled = torch.compile(lambda t: scale(t) * 2, fullgraph=True)
first = compiled(a)
graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
before["python_call"] = entered_python_call(scale, a)
t0 = time.perf_counter()
ready = switch.wait(timeout=600)
after = {"ready": ready, "wait_s": round(time.perf_counter() - t0, 1), "native": [op._native for op in ops],
         "cuda": [cuda_kernel(op) for op in ops], "status": switch.status()}
a, after["results"] = results(0)
after["compiled_same"] = torch.equal(compiled(a), first)
after["recompiled"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] != graphs
after["python_call"] = entered_python_call(scale, a)
after["autograd_kernels"] = [line.split(":")[0] for line in dump(bump).splitlines() if "Autograd" in line]
print("RESULT " + json.dumps({"before": before, "after": after}), flush=True)
"""


def _env(pnex_env: dict, stand_in: Path, cache: Path, **extra: str) -> dict:
    env = launcher_stand_in.environment(pnex_env, stand_in)
    return dict(env, PNEX_CACHE_DIR=str(cache), PNEX_LAUNCHER="auto", **extra)


def _run(code: str, env: dict, timeout: float = 900) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and "RESULT " in done.stdout, (done.stdout[-3000:], done.stderr[-3000:])
    return json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0]), done.stdout + done.stderr


def _notes(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("LOG pnex_magic")]


def _sections(cache: Path) -> int:
    """How many builds of the launcher ran into ``cache`` (a section of its log each)."""
    return sum(log.read_text().count("pnex: building the C++ launcher") for log in (cache / "launcher").glob("*.log"))


# stand_in and built_launcher: session fixtures of conftest.py (tests/test_requires.py uses the build too).


def test_two_processes_start_one_build_and_their_ops_switch_to_it(stand_in, tmp_path, pnex_env):
    """Two processes define ops in an empty environment at once: the ops serve at once
    (the Python launcher), one build runs, and each process's live ops move onto it."""
    cache = tmp_path / "cache"
    env = _env(pnex_env, stand_in, cache)
    procs = [subprocess.Popen([sys.executable, "-c", SWITCH], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0 and "RESULT " in out, (out[-3000:], err[-3000:])
    assert _sections(cache) == 1  # one build for both
    reference = {"scale": True, "square": True, "grad": True, "bump": True, "tuned": True}
    for out, err in outputs:
        record = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        before, after = record["before"], record["after"]
        assert before["native"] == [False] * 5 and before["cuda"] == [False] * 5, before
        assert before["status"] == "building in the background"
        assert after["ready"] and after["native"] == [True] * 5 and after["cuda"] == [True] * 5, (after, _notes(out))
        for results in (before["results"], after["results"]):
            refused = results.pop("refused")
            assert results == reference
            assert refused.startswith("ArgumentTypeError: bump(): argument 'a' is written in place")
        assert after["compiled_same"] and not after["recompiled"]
        assert before["python_call"] and not after["python_call"]  # the C call slot, once switched
        # bump's InMut check: the C++ autograd kernel at the keys where the Python check was
        assert {"AutogradCPU", "AutogradCUDA", "Autograd[alias]"} <= set(after["autograd_kernels"])
        assert "Overriding a previously registered kernel" not in out + err
        assert _notes(out) == []  # nothing to say: the build worked
    print(f"\n[first run] two processes, one build; switched after {record['after']['wait_s']} s")


THREADS = PRELUDE + """
target = native._target()
import fcntl, shutil
lock = background.hold(target)  # as a build process holds it: this process starts none
@pnex.jit(n_threads="a.numel()")
def offset(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] + 0.25
assert not offset._native and switch.status() == "building in the background"
empty = torch.empty(0)
stop = threading.Event()
failures, counts = [], []

def worker(seed):
    g = torch.Generator().manual_seed(seed)
    n = 0
    try:
        while not stop.is_set():
            for op, f in ((scale, lambda t: t * 2 + 1), (offset, lambda t: t + 0.25)):
                assert op(empty).shape == (0,)  # the whole call but the launch
                n += 1
                if n % 200 == 0:
                    a = torch.randn(5, generator=g)
                    assert torch.equal(op(a), f(a.double()).float()), "wrong result"
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
    counts.append(n)

threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
for t in threads:
    t.start()
time.sleep(1.0)
partial = target.folder.parent / f".{target.folder.name}.tmp-test"
shutil.copytree(sys.argv[1], partial)
os.rename(partial, target.folder)  # the build process's last step
fcntl.flock(lock, fcntl.LOCK_UN)
t0 = time.perf_counter()
ready = switch.wait(timeout=120)
waited = time.perf_counter() - t0
time.sleep(1.0)
stop.set()
for t in threads:
    t.join()
print("RESULT " + json.dumps({"ready": ready, "waited_s": waited, "native": [scale._native, offset._native],
                             "failures": failures, "calls": sum(counts)}), flush=True)
"""


def test_calls_on_four_threads_go_on_while_the_ops_switch(built_launcher, stand_in, tmp_path, pnex_env):
    """Four threads call two ops in a loop while the build lands and the ops switch: every
    call succeeds and every checked result is right; the switch waits for a moment with
    no op-object call in flight, and it comes."""
    record, output = _run(THREADS.replace("sys.argv[1]", repr(str(built_launcher))),
                          _env(pnex_env, stand_in, tmp_path / "cache"))
    assert record["failures"] == [], record
    assert record["ready"] and record["native"] == [True, True], record
    assert "Overriding a previously registered kernel" not in output
    print(f"\n[first run] {record['calls']} calls on 4 threads; switched {record['waited_s']:.2f} s after the build "
          f"landed")


NOT_BUILT = """
import os
if os.environ["PNEX_TEST_PROBLEM"] == "headers":  # before the first definition
    from pnex_magic.launch import build
    build.cuda_include_dir = lambda: None
""" + PRELUDE + """
a = torch.randn(9)
ok = []
for k in range(2):
    @pnex.jit(n_threads="a.numel()")
    def another(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] - 1.0
    ok += [torch.equal(scale(a), a * 2 + 1), torch.equal(another(a), a - 1)]
ready = switch.wait(timeout=600)
ok += [torch.equal(scale(a), a * 2 + 1) for _ in range(3)]
print("RESULT " + json.dumps({"ok": ok, "ready": ready, "native": scale._native, "status": switch.status()}), flush=True)
"""


@pytest.mark.parametrize("problem", ["compiler", "headers", "read-only", "failed build"])
def test_where_the_launcher_cannot_be_built_one_note_says_why(problem, stand_in, tmp_path, pnex_env):
    """No compiler, no CUDA headers, a cache folder that cannot be written, a build that
    fails: the ops give the right results through the Python launcher, and one note per
    process says why (naming the compiler's output for a failed build); a failed build
    is not tried again by the next process."""
    cache = tmp_path / "cache"
    env = _env(pnex_env, stand_in, cache, PNEX_TEST_PROBLEM=problem)
    if problem == "compiler":
        env["CXX"] = str(tmp_path / "no-such-compiler")
    elif problem == "read-only":
        cache = tmp_path / "read-only"
        cache.mkdir()
        (cache / "launcher").write_text("a file where the launcher's folder would go")
        env["PNEX_CACHE_DIR"] = str(cache)
    elif problem == "failed build":
        env["PNEX_TEST_STAND_IN_BROKEN"] = "1"  # the build misses the stand-in header: it fails to compile
    runs = [_run(NOT_BUILT, env) for _ in range(2)] if problem == "failed build" else [_run(NOT_BUILT, env)]
    expected = {
        "compiler": "needs a host C++ compiler (",
        "headers": "needs the CUDA headers",
        "read-only": "cannot be written",
        "failed build": "the C++ launcher's build failed",
    }[problem]
    for record, output in runs:
        assert all(record["ok"]) and not record["ready"] and not record["native"], (record, _notes(output))
        notes = _notes(output)
        assert len(notes) == 1 and expected in notes[0], notes
        assert "CUDA calls go through the Python launcher" in notes[0]
    if problem == "failed build":
        log = notes[0].rsplit(" ", 1)[1]
        assert Path(log).is_file() and "cuda_cmake_macros.h" in Path(log).read_text()  # the compiler's output
        assert _sections(cache) == 1  # the second process did not try again
    elif problem != "read-only":
        assert _sections(cache) == 0  # no build was started


def test_a_launcher_shipped_in_the_package_is_used_without_any_build(built_launcher, stand_in, tmp_path, pnex_env):
    """A launcher found in the package's ``prebuilt/`` folder for this torch serves from the
    first definition: no build starts, nothing is written to the cache's launcher folder."""
    import torch

    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    [library] = built_launcher.glob("pnex_launcher_*.so")
    shutil.copy(library, prebuilt / "launcher.so")
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    (prebuilt / "launcher.json").write_text(json.dumps({"module": library.name.split(".")[0], "library": "launcher.so",
                                                        "torch": [version]}))
    code = PRELUDE.replace("from pnex_magic.launch import background, native, switch",
                           f"from pnex_magic.launch import background, native, switch\nfrom pathlib import Path\n"
                           f"native.PREBUILT = Path({str(prebuilt)!r})") + textwrap.dedent("""
        a = torch.randn(6)
        print("RESULT " + json.dumps({"native": scale._native, "ok": torch.equal(scale(a), a * 2 + 1)}), flush=True)
    """)
    cache = tmp_path / "cache"
    record, output = _run(code, _env(pnex_env, stand_in, cache))
    assert record == {"native": True, "ok": True}
    assert not (cache / "launcher").exists() or not any((cache / "launcher").iterdir())
    assert _notes(output) == []
