"""The first run in a fresh environment (issue 27): every figure in fresh processes with
an empty ``PNEX_CACHE_DIR`` (and empty Inductor and Triton caches), as a new Colab
runtime, container, CI job or virtual environment has.

    python benchmarks/fresh_env.py                       # the GPU (CPU tensors where there is none)
    python benchmarks/fresh_env.py --rounds 3 --skip notebook,jax
    python benchmarks/fresh_env.py --cu12 /tmp/pnex-cu12a:/tmp/pnex-cu12b   # Colab's CUDA 12 toolchain

Rows (each round runs each once, interleaved; a row's figure is its minimum over the
rounds, its median beside it):

* ``first_cell_report_s``: a ``%%pnex`` cell of a new kernel with ``--args`` (and
  ``--eager``), run 2 s after ``%load_ext pnex_magic`` in a fresh Jupyter kernel, from
  the cell's start to the report shown (``benchmarks/first_use.py``'s notebook run);
  goal <= 2 s.
* ``demo_s``: ``python -m pnex_magic``, wall time; beside it a process that does what
  the demo does without pnex (``import torch``, CUDA, ``torch.compile`` of the demo's
  expression with native ops): ``torch_import_s`` and ``torch_compile_first_s``, and
  the goal ``demo_s <= torch_import_s + torch_compile_first_s + 3``, judged per round
  (``demo_over_baseline_s``, the demo less that round's import and compile).
* ``launcher_ready_s``: from the first op definition until the C++ launcher serves it
  (``pnex_magic.launch.switch.wait()``: the background build, its import and the switch),
  with the build's own time from its log (``build_s``).
* ``per_call_us_before`` / ``per_call_us_after``: the 1-D copy and the 2-D signature
  with five tensors and two scalars, timed as ``benchmarks/overhead.py
  --signatures-only`` times them against ``torch.clone`` and ``torch.addcmul``,
  before the C++ launcher is there (the Python driver launcher; the process holds the
  build's lock meanwhile, so that the build starts only after) and after the switch,
  in the same process.
* ``jax_first_call_s``: a new kernel's first ``jax.jit`` call (the client's start and
  imports excluded), which launches through a Python callback while the XLA handler
  builds in the background; ``jax_after_handler_s``: a new trace's first call once it
  is built, through the handler.

Without a GPU (``--device cpu``) the first cell and the demo run on CPU tensors (the
simulator) and ``launcher_ready_s`` is the real launcher built against the CPU torch
with the stand-ins of ``tests/launcher_stand_in.py`` (the 2-core build figure); the
per-call and JAX rows need a GPU.

``--cu12 FOLDERS``: the CUDA 12 NVVM and nvJitLink wheels of ``benchmarks/cuda12_check.py``
(installed into FOLDERS, its docstring says how) go first on every child's
``PYTHONPATH`` and are loaded before numba-cuda looks for its own, as on Colab.

Prints a table and writes ``benchmarks/results/fresh-env-<date>.json`` (the GPU, the
versions, the date).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROWS = ("notebook", "demo", "launcher", "per_call", "jax")
GOALS = {"first_cell_report_s": 2.0, "demo_over_baseline_s": 3.0, "per_call_ratio_after": 1.05}

__all__ = ["main", "GOALS", "ROWS"]


def _child(code: str, env: dict[str, str], timeout: float = 1200) -> tuple[dict, float]:
    """Run ``code`` in a fresh interpreter; the data of its ``RESULT {json}`` line and the
    process's wall time."""
    begin = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    wall = time.perf_counter() - begin
    if done.returncode != 0 or "RESULT " not in done.stdout:
        raise RuntimeError(f"benchmark child failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0]), wall


def _stop_builds(cache: Path) -> None:
    """End the background build processes a round left building into ``cache`` (they
    outlive the processes that started them), so that the next round starts alone."""
    from pnex_magic.launch import background

    for pid in background.processes(cache):
        try:
            os.killpg(pid, signal.SIGKILL)  # the build process, ninja and the compilers
        except ProcessLookupError:
            pass


class Fresh:
    """Fresh environments for the children: an empty pnex, Inductor and Triton cache
    each, ``PNEX_LAUNCHER=auto``, and the extra settings of ``--cu12`` / the CPU stand-ins."""

    def __init__(self, root: Path, base: dict[str, str]) -> None:
        self.root = root
        self.base = base
        self.count = 0
        self.caches: list[Path] = []

    def env(self, **extra: str) -> dict[str, str]:
        self.count += 1
        folder = self.root / f"env-{self.count}"
        env = dict(self.base, PNEX_CACHE_DIR=str(folder / "pnex"), TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"),
                   TRITON_CACHE_DIR=str(folder / "triton"), PNEX_LAUNCHER="auto")
        env.pop("PNEX_WARMUP", None)
        env.update(extra)
        self.caches.append(folder / "pnex")
        return env

    def stop(self) -> None:
        for cache in self.caches:
            _stop_builds(cache)


def _cu12_environment(folders: str, root: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the CUDA 12 wheels' folders first on ``PYTHONPATH`` and their NVVM and
    nvJitLink loaded at every interpreter's start (a ``sitecustomize``)."""
    site = root / "cu12-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(HERE)!r})
        before = os.environ.get("CUDA_DISABLE_PTX_JIT")
        from cuda12_check import preload_cuda12  # sets CUDA_DISABLE_PTX_JIT at import: put back
        if before is None:
            os.environ.pop("CUDA_DISABLE_PTX_JIT", None)
        preload_cuda12()
    """))
    path = [folders, str(site), env.get("PYTHONPATH", "")]
    return dict(env, PYTHONPATH=os.pathsep.join(p for p in path if p))


# ----------------------------------------------------------------------------- the rows

def notebook_row(fresh: Fresh, device: str, salt: float, profile: bool = False) -> dict:
    """The first ``%%pnex`` cell (new kernel, ``--args``) in a fresh Jupyter kernel and a
    fresh cache; ``profile``: under cProfile, its table returned as ``profile``."""
    sys.path.insert(0, str(HERE))
    from first_use import _notebook_seconds

    size = "(1<<20)" if device == "cuda" else "64"
    cell = (
        f"%%pnex --n-threads a.numel() --args (torch.randn({size},device={device!r}),) --eager lambda a: a * {salt!r}\n"
        "def fresh_cell(a: In(\"f32\", (None,)), result: Out(\"f32\", \"a\")):\n"
        "    i = cuda.grid(1)\n"
        "    if i < a.shape[0]:\n"
        f"        result[i] = a[i] * {salt!r}\n"
    )
    sample = _notebook_seconds(salt, fresh.env(), cell=cell, profile=profile)
    if not sample["report_shown"] or sample["misses"] < 1:  # (on a GPU its checked variant is compiled too)
        raise RuntimeError(f"the notebook cell did not compile a new kernel and show its report: {sample}")
    found = {"first_cell_report_s": sample["seconds"], "first_cell_end_s": sample["cell_s"],
             "load_ext_s": sample["load_ext_s"], "warmup_s": sample["warmup_s"]}
    if profile:
        found["profile"] = sample["profile"]
    return found


BASELINE = """
import time
w0 = time.time()
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
device = "cuda" if torch.cuda.is_available() else "cpu"
shape = (1024, 1024) if device == "cuda" else (48, 40)
a, b = torch.randn(shape, device=device), torch.randn(shape, device=device)
if device == "cuda":
    torch.cuda.synchronize()
t2 = time.perf_counter()
compiled = torch.compile(lambda a, b: (a * b + 0.5) * 2, fullgraph=True)
compiled(a, b)
if device == "cuda":
    torch.cuda.synchronize()
t3 = time.perf_counter()
import json
print("RESULT " + json.dumps({"torch_import_s": t1 - t0, "cuda_init_s": t2 - t1, "torch_compile_first_s": t3 - t2,
                             "wall_start": w0, "wall_end": time.time()}))
"""

# ``python -m pnex_magic`` as the user runs it (runpy, as -m does), with wall-clock stamps:
# when the interpreter reached it, when the demo returned and when the exit handlers that
# torch registered after it had run (the stamps go to stderr).
DEMO = """
import atexit, runpy, sys, time
w0 = time.time()
returned = []
atexit.register(lambda: print("STAMPS", w0, returned[0] if returned else None, time.time(), file=sys.stderr, flush=True))
sys.argv = ["pnex_magic"]
try:
    runpy.run_module("pnex_magic", run_name="__main__", alter_sys=True)
finally:
    returned.append(time.time())
"""


def demo_row(fresh: Fresh) -> dict:
    """The demo in a fresh environment, and a bare process doing what any torch.compile
    user's does (import torch, CUDA, a first compile), each split into the interpreter's
    start, the work and the exit (its handlers: torch's compile workers, CUDA)."""
    spawned = time.time()
    base, base_wall = _child(BASELINE, fresh.env())
    base_split = {"baseline_start_s": base.pop("wall_start") - spawned,
                  "baseline_exit_s": spawned + base_wall - base.pop("wall_end")}
    env = fresh.env()
    spawned = time.time()
    begin = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", DEMO], capture_output=True, text=True, timeout=1200, env=env)
    wall = time.perf_counter() - begin
    if done.returncode != 0 or "OK" not in done.stdout:
        raise RuntimeError(f"the demo failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    stamps = [line.split()[1:] for line in done.stderr.splitlines() if line.startswith("STAMPS ")]
    split = {}
    if stamps and stamps[-1][1] != "None":
        w0, returned, handlers = (float(x) for x in stamps[-1])
        split = {"demo_start_s": w0 - spawned, "demo_work_s": returned - w0, "demo_exit_s": spawned + wall - returned,
                 "demo_exit_handlers_s": handlers - returned}
    over = wall - base["torch_import_s"] - base["torch_compile_first_s"]
    return {"demo_s": wall, **base, "baseline_process_s": base_wall, **base_split, **split,
            "demo_over_baseline_s": over, "demo_over_baseline_process_s": wall - base_wall,
            "demo_said": [line for line in done.stderr.splitlines() if line.startswith("pnex")]}


LAUNCHER = """
import json, re, time
import torch
from numba import cuda
import pnex_magic as pnex
from pnex_magic.launch import background, native, switch
device = "cuda" if torch.cuda.is_available() else "cpu"
a = torch.randn(4096 if device == "cuda" else 64, device=device)
t0 = time.perf_counter()
@pnex.jit(n_threads="a.numel()")
def fresh_ready(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * 3.0
t1 = time.perf_counter()
out = fresh_ready(a)
if device == "cuda":
    torch.cuda.synchronize()
t2 = time.perf_counter()
torch.testing.assert_close(out, a * 3)
waiting = switch.status()
ready = switch.wait()
t3 = time.perf_counter()
torch.testing.assert_close(fresh_ready(a), a * 3)
log = background.log_path(native._target()).read_text()
built = re.findall(r"built in ([0-9.]+) s", log)
print("RESULT " + json.dumps({"launcher_ready_s": t3 - t0, "define_s": t1 - t0, "first_call_s": t2 - t1,
                             "ready": ready, "native": fresh_ready._native, "while_building": waiting,
                             "build_s": float(built[-1]) if built else None}))
"""


def launcher_row(fresh: Fresh, device: str) -> dict:
    env = fresh.env()
    if device == "cpu":  # the real launcher against the CPU torch, with the tests' stand-ins
        sys.path.insert(0, str(ROOT / "tests"))
        import launcher_stand_in

        env = launcher_stand_in.environment(env, fresh.root / "stand-in")
    found, _ = _child(LAUNCHER, env)
    if not (found["ready"] and found["native"]):
        raise RuntimeError(f"the C++ launcher did not come: {found}")
    return found


PER_CALL = """
import fcntl, json, sys
sys.path.insert(0, {here!r})
import torch
import overhead
from pnex_magic.launch import background, native, switch
target = native._target()
lock = background.hold(target)  # as a build process holds it: none starts until "before" is timed
ns = {{}}
exec(overhead.SIGNATURE_DEFS, ns)
cases = [c for c in overhead._signature_cases(ns) if c[0] in ("1-D copy", "2-D, 5 tensors + 2 scalars")]

def table(rounds):
    measurements = {{}}
    for signature, _, op, native_op, _, args, expected in cases:
        torch.testing.assert_close(op(*args), expected())
        measurements[signature + "|pnex"] = lambda op=op, args=args: overhead.per_call_args_us(op, args)
        measurements[signature + "|native"] = lambda f=native_op, args=args: overhead.per_call_args_us(f, args)
    figures = overhead.rounds_of(measurements, rounds, log=lambda text: print(text, file=sys.stderr))
    return {{signature: {{"pnex_us": min(figures[signature + "|pnex"]), "native_us": min(figures[signature + "|native"]),
                          "pnex_rounds": figures[signature + "|pnex"], "native_rounds": figures[signature + "|native"]}}
            for signature, *_ in cases}}

ops = [c[2] for c in cases]
assert not any(op._native for op in ops), "the C++ launcher was there before"
before = table({rounds})
fcntl.flock(lock, fcntl.LOCK_UN)
ready = switch.wait()
assert ready and all(op._native for op in ops), switch.status()
after = table({rounds})
print("RESULT " + json.dumps({{"before": before, "after": after}}))
"""


def per_call_row(fresh: Fresh, rounds: int) -> dict:
    found, _ = _child(PER_CALL.format(here=str(HERE), rounds=rounds), fresh.env())
    row = {}
    for phase in ("before", "after"):
        for signature, figures in found[phase].items():
            figures["ratio"] = figures["pnex_us"] / figures["native_us"]
        row[f"per_call_us_{phase}"] = found[phase]
    return row


JAX = """
import os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import json, time
import jax, jax.numpy as jnp, numpy as np, torch
from numba import cuda
import pnex_magic as pnex
from pnex_magic.launch import background, xla
jax.devices("cuda")  # the client's start: not pnex's
x = jnp.arange(1 << 20, dtype=jnp.float32)
t0 = time.perf_counter()
@pnex.jit(n_threads="a.numel()")
def fresh_jax(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * 2.0 + 1.0
f = jax.jit(pnex.jax_op(fresh_jax))
y = f(x).block_until_ready()
t1 = time.perf_counter()
first_through = "handler" if xla.library_available() else "callback"
np.testing.assert_array_equal(np.asarray(y), np.asarray(x) * 2 + 1)
state = background.wait(xla.handler_build(), timeout=900)
g = jax.jit(lambda a: pnex.jax_op(fresh_jax)(a) - 1.0)  # a new trace
t2 = time.perf_counter()
z = g(x).block_until_ready()
t3 = time.perf_counter()
np.testing.assert_array_equal(np.asarray(z), np.asarray(x) * 2)
print("RESULT " + json.dumps({"jax_first_call_s": t1 - t0, "jax_first_call_through": first_through,
                             "handler_build": state, "jax_after_handler_s": t3 - t2,
                             "jax_after_handler_through": "handler" if xla.library_available() else "callback"}))
"""


def jax_row(fresh: Fresh) -> dict:
    found, _ = _child(JAX, fresh.env())
    return found


# ----------------------------------------------------------------------------- rounds, table

def run_rounds(device: str, rounds: int, skip: set[str], base_env: dict[str, str], log=print) -> list[dict]:
    samples = []
    with tempfile.TemporaryDirectory(prefix="pnex-fresh-env-") as tmp:
        fresh = Fresh(Path(tmp), base_env)
        salt = 1.0 + (time.time_ns() % 1_000_000) / 1e7
        for r in range(rounds):
            sample: dict = {"round": r}
            for name in ROWS[r % len(ROWS):] + ROWS[:r % len(ROWS)]:
                if name in skip or (device == "cpu" and name in ("per_call", "jax")):
                    continue
                log(f"round {r + 1}/{rounds}: {name}", flush=True)
                if name == "notebook":
                    sample.update(notebook_row(fresh, device, salt + r / 64))
                elif name == "demo":
                    sample.update(demo_row(fresh))
                elif name == "launcher":
                    sample.update(launcher_row(fresh, device))
                elif name == "per_call":
                    sample.update(per_call_row(fresh, 3))
                else:
                    sample.update(jax_row(fresh))
                fresh.stop()  # what this row started building must not slow the next
            samples.append(sample)
            log(json.dumps({k: v for k, v in sample.items() if not k.startswith("per_call")}), flush=True)
    return samples


SCALARS = ("first_cell_report_s", "demo_s", "torch_import_s", "torch_compile_first_s", "demo_over_baseline_s",
           "demo_over_baseline_process_s", "baseline_start_s", "baseline_exit_s", "demo_start_s", "demo_work_s",
           "demo_exit_s",
           "launcher_ready_s", "build_s", "jax_first_call_s", "jax_after_handler_s")


def summarise(samples: list[dict]) -> dict:
    summary: dict = {}
    for key in SCALARS:
        values = [s[key] for s in samples if isinstance(s.get(key), (int, float))]
        if values:
            summary[key] = min(values)
            summary[f"{key}_median"] = statistics.median(values)
    for phase in ("before", "after"):
        runs = [s[f"per_call_us_{phase}"] for s in samples if f"per_call_us_{phase}" in s]
        if runs:
            summary[f"per_call_us_{phase}"] = {
                signature: {k: min(r[signature][k] for r in runs) for k in ("pnex_us", "native_us")}
                for signature in runs[0]
            }
            for signature, figures in summary[f"per_call_us_{phase}"].items():
                figures["ratio"] = figures["pnex_us"] / figures["native_us"]
    return summary


def print_table(summary: dict, device: str) -> None:
    print(f"\nfresh environment, {device} (minimum over rounds; median in brackets)")
    for key in SCALARS:
        if key in summary:
            goal = ""
            if key == "first_cell_report_s":
                goal = f"  goal <= {GOALS[key]} s: {'met' if summary[key] <= GOALS[key] else 'missed'}"
            if key == "demo_over_baseline_s":  # per round: the demo less that round's import and compile
                limit = GOALS["demo_over_baseline_s"]
                goal = f"  (demo - torch import - first compile) goal <= {limit} s: {'met' if summary[key] <= limit else 'missed'}"
            print(f"  {key:26s} {summary[key]:8.3f} s ({summary[key + '_median']:.3f}){goal}")
    for phase in ("before", "after"):
        for signature, figures in summary.get(f"per_call_us_{phase}", {}).items():
            goal = f"  goal <= {GOALS['per_call_ratio_after']}x" if phase == "after" else ""
            print(f"  per call {phase:6s} {signature:28s} pnex {figures['pnex_us']:7.2f} us, native "
                  f"{figures['native_us']:6.2f} us = {figures['ratio']:.3f}x{goal}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="cuda (default where there is a GPU) or cpu (CUDA simulator, stand-in launcher)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every row (default 2)")
    parser.add_argument("--skip", default="", help=f"comma-separated rows to skip, of {', '.join(ROWS)}")
    parser.add_argument("--cu12", metavar="FOLDERS", default=None,
                        help="folders holding the CUDA 12 wheels (benchmarks/cuda12_check.py), put first on "
                             "every child's PYTHONPATH and loaded at its start")
    parser.add_argument("--profile-first-cell", action="store_true",
                        help="only the first-cell row, once, under cProfile: its table printed (no figures written)")
    opts = parser.parse_args(argv)
    skip = {s for s in opts.skip.split(",") if s}
    unknown = skip - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; the rows are {', '.join(ROWS)}")

    import torch

    sys.path.insert(0, str(HERE))
    from bench_common import result_header, versions, write_result

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    base = dict(os.environ)
    if opts.profile_first_cell:
        with tempfile.TemporaryDirectory(prefix="pnex-fresh-profile-") as tmp:
            fresh = Fresh(Path(tmp), base)
            try:
                found = notebook_row(fresh, device, 1.0 + (time.time_ns() % 1_000_000) / 1e7, profile=True)
            finally:
                fresh.stop()
        print(found.pop("profile"))
        print("first cell (under the profiler):", json.dumps(found))
        return 0
    with tempfile.TemporaryDirectory(prefix="pnex-fresh-cu12-") as cu12_root:
        if opts.cu12:
            base = _cu12_environment(opts.cu12, Path(cu12_root), base)
        samples = run_rounds(device, opts.rounds, skip, base)
    summary = summarise(samples)
    if device == "cuda":
        header = result_header("fresh-env", "jax", "jaxlib")
    else:
        import datetime

        header = {"benchmark": "fresh-env-cpu", "versions": versions("jax", "jaxlib"),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    header.update(cpus=os.cpu_count(), device=device, cu12=opts.cu12, rounds=opts.rounds, goals=GOALS)
    stem = "fresh-env" + ("-cu12" if opts.cu12 else "") + ("" if device == "cuda" else "-cpu")
    path = write_result({**header, **summary, "samples": samples}, stem)
    print_table(summary, device)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
