"""The first run in a fresh environment on a GPU (issue 27), each case in fresh processes
with an empty ``PNEX_CACHE_DIR`` and ``PNEX_LAUNCHER=auto`` (the session's tests run with
``native``: see conftest.py).

* Ops defined while the C++ launcher builds in the background give the right results on
  every path through the Python driver launcher (eager, ``torch.compile``, CUDA graphs,
  autotune, checked launches); after the switch the same, through the C++ launcher: a
  CUDA graph captured before it replays right, a function compiled before it runs
  without a recompile, and the op object's call runs no Python.
* With no host compiler, or no CUDA headers, every path is right through the driver
  launcher, and one note says why.
* JAX: a first trace launches through ``buffer_callback`` while the XLA handler builds,
  with the handler's results bit for bit, and a new trace once it is built calls it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from first_run_child import ENTERED_PYTHON_CALL

pytestmark = pytest.mark.gpu

PATHS = """
import fcntl, json, logging, os, sys, time
logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s", stream=sys.stdout)
import torch
from numba import cuda
import pnex_magic as pnex
from pnex_magic.launch import background, build, native, switch
if os.environ.get("PNEX_TEST_NO_HEADERS"):  # as where neither a toolkit nor the header wheels are installed
    build.cuda_include_dir = lambda: None

try:
    lock = background.hold(native._target())  # as a build process holds it: the build starts after "before"
except pnex.KernelCompileError:  # no CUDA headers: no build to hold
    lock = None

@pnex.jit(n_threads="a.numel()")
def axpb(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), s: float, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * s + b[i]

@pnex.jit(n_threads="(a.numel() + ITEMS - 1) // ITEMS", threads_per_block="auto")
def tuned(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a"), ITEMS: pnex.Tune(1, 4)):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            out[j] = a[j] + 1.0

@pnex.jit(n_threads="x.numel()")
def bump(x: pnex.InMut("f32", (None,)), y: pnex.In("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] += y[i]

@pnex.jit(n_threads="a.numel()", check=True)
def shifted(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a"), k: int):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i + k]

ops = [axpb, tuned, bump, shifted]
g = torch.Generator(device="cuda").manual_seed(0)
a, b = torch.randn(100_000, device="cuda", generator=g), torch.randn(100_000, device="cuda", generator=g)
compiled = torch.compile(lambda a, b: axpb(a, b, 0.5) * 2, fullgraph=True)
static = torch.empty_like(a)

def paths():
    found = {}
    found["eager"] = torch.equal(axpb(a, b, 0.5), a * 0.5 + b)
    found["compiled"] = torch.equal(compiled(a, b), (a * 0.5 + b) * 2)
    found["tuned"] = torch.equal(tuned(a), a + 1)
    x = a.clone()
    with torch.no_grad():
        bump(x, b)
    found["inmut"] = torch.equal(x, a + b)
    found["checked"] = torch.equal(shifted(a[:1000], 0), a[:1000])
    try:
        shifted(a[:1000], 5)
        found["checked_violation"] = None
    except IndexError as exc:
        found["checked_violation"] = type(exc).__name__
    axpb(a, b, 0.5)  # warm the stream before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.copy_(axpb(a, b, 0.5))
    graph.replay()
    torch.cuda.synchronize()
    found["graph"] = torch.equal(static, a * 0.5 + b)
    return found, graph

""" + ENTERED_PYTHON_CALL + """
before, graph_before = paths()
record = {"before": before, "native_before": [op._native for op in ops], "status_before": switch.status(),
          "python_call_before": entered_python_call(axpb, a, b, 0.5)}
graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
if lock is not None:
    fcntl.flock(lock, fcntl.LOCK_UN)
record["ready"] = switch.wait(timeout=900)
record["native_after"] = [op._native for op in ops]
static.zero_()
graph_before.replay()  # captured through the driver launcher, replayed after the switch
torch.cuda.synchronize()
record["graph_captured_before"] = torch.equal(static, a * 0.5 + b)
record["after"], _ = paths()
record["recompiled"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] != graphs
record["python_call_after"] = entered_python_call(axpb, a, b, 0.5)
print("RESULT " + json.dumps(record), flush=True)
"""

EXPECTED = {"eager": True, "compiled": True, "tuned": True, "inmut": True, "checked": True,
            "checked_violation": "KernelIndexError", "graph": True}


def _run(code: str, env: dict) -> tuple[dict, str]:
    # From a file, as a user's script: the checked variant reads the kernels' source.
    script = Path(env["PNEX_CACHE_DIR"]).parent / "first_run_script.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0 and "RESULT " in done.stdout, (done.stdout[-3000:], done.stderr[-3000:])
    return json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0]), done.stdout + done.stderr


def _fresh(pnex_env: dict, tmp_path, **extra: str) -> dict:
    return dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
                PNEX_LAUNCHER="auto", **extra)


def test_every_path_is_right_before_and_after_the_switch(tmp_path, pnex_env):
    record, output = _run(PATHS, _fresh(pnex_env, tmp_path))
    assert record["native_before"] == [False] * 4 and record["status_before"] == "building in the background"
    assert record["before"] == EXPECTED and record["python_call_before"]
    assert record["ready"] and record["native_after"] == [True] * 4, record
    assert record["after"] == EXPECTED and record["graph_captured_before"]
    assert not record["recompiled"] and not record["python_call_after"]
    assert "Overriding a previously registered kernel" not in output
    assert not [line for line in output.splitlines() if line.startswith("LOG pnex_magic")], output[-3000:]


@pytest.mark.parametrize("missing", ["compiler", "headers"])
def test_without_a_compiler_or_headers_every_path_is_right_and_one_note_says_why(missing, tmp_path, pnex_env):
    hide = {"CXX": str(tmp_path / "no-compiler")} if missing == "compiler" else {"PNEX_TEST_NO_HEADERS": "1"}
    record, output = _run(PATHS, _fresh(pnex_env, tmp_path, **hide))
    assert record["before"] == EXPECTED and record["after"] == EXPECTED and record["graph_captured_before"]
    assert not record["ready"] and record["native_after"] == [False] * 4
    notes = [line for line in output.splitlines() if line.startswith("LOG pnex_magic")]
    said = "needs a host C++ compiler" if missing == "compiler" else "needs the CUDA headers"
    assert len(notes) == 1 and said in notes[0], notes
    assert not (tmp_path / "cache" / "launcher").exists() or not list((tmp_path / "cache" / "launcher").glob("*.log"))


JAX = """
import os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import fcntl, json, sys
import jax, jax.numpy as jnp, numpy as np
from numba import cuda
import pnex_magic as pnex
from pnex_magic.launch import background, xla

target = xla.handler_build()
lock = background.hold(target)  # as its build process holds it: the first traces cannot have it

@pnex.jit(n_threads="a.numel()")
def accumulate(a: pnex.In("f32", (None,)), m: pnex.InMut("f32", "a"), c: float,
               hist: pnex.Out("i32", (4,), init=0), even: pnex.Out("f32", "a", init=1.5)):
    i = cuda.grid(1)
    if i < a.shape[0]:
        m[i] += a[i] * c
        if i % 2 == 0:
            even[i] = a[i]
        cuda.atomic.add(hist, i % 4, 1)

f = pnex.jax_op(accumulate)
a = jnp.asarray(np.random.default_rng(0).standard_normal(10_001).astype(np.float32))
m = jnp.asarray(np.random.default_rng(1).standard_normal(10_001).astype(np.float32))
step = jax.jit(lambda a, m: f(a, m, 2.0))
first = [np.asarray(r) for r in step(a, m)]
through_first = "handler" if xla.library_available() else "callback"
text_first = step.lower(a, m).as_text()
fcntl.flock(lock, fcntl.LOCK_UN)
background.build_now(target)
step2 = jax.jit(lambda a, m: f(a, m, 2.0))  # a new trace
second = [np.asarray(r) for r in step2(a, m)]
print("RESULT " + json.dumps({
    "through_first": through_first, "callback_in_hlo": "xla_buffer_python_gpu_callback" in text_first,
    "handler_in_hlo": xla.TARGET in step2.lower(a, m).as_text(), "through_second": "handler" if xla.library_available() else "callback",
    "same": all(np.array_equal(x, y) for x, y in zip(first, second)),
    "hist": first[0].tolist(), "even_ok": bool(np.array_equal(first[1][1::2], np.full(5000, 1.5, np.float32))
                                              and np.array_equal(first[1][0::2], np.asarray(a)[0::2])),
    "m_ok": bool(np.allclose(first[2], np.asarray(m) + np.asarray(a) * 2.0, rtol=0, atol=1e-6)),
}), flush=True)
"""


def test_jax_launches_through_a_callback_until_the_handler_is_built(tmp_path, pnex_env):
    pytest.importorskip("jax")
    record, _ = _run(JAX, _fresh(pnex_env, tmp_path, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    assert record["through_first"] == "callback" and record["callback_in_hlo"]
    assert record["through_second"] == "handler" and record["handler_in_hlo"]
    assert record["same"] and record["hist"] == [2501, 2500, 2500, 2500] and record["even_ok"] and record["m_ok"]


def test_jax_with_the_driver_launcher_matches_the_handler_bit_for_bit(tmp_path, pnex_env):
    """PNEX_LAUNCHER=driver: every GPU trace through the callback; the notebook's diffusion
    loop gives the handler's result to the bit."""
    pytest.importorskip("jax")
    code = textwrap.dedent("""
        import os
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import json, sys
        sys.path.insert(0, BENCHMARKS)
        import jax, jax.numpy as jnp, numpy as np
        import pnex_magic as pnex
        import jax_overhead, workloads
        from pnex_magic.launch import xla
        u0 = jnp.asarray(workloads.initial_field(256).numpy())
        step = pnex.jax_op(workloads.diffusion_step)
        loop = jax_overhead.diffusion_loops(step, jnp, jax, 21)["pnex in JAX, pair carry (notebook 06)"]
        got = np.asarray(loop(u0))
        print("RESULT " + json.dumps({"field": got.tobytes().hex(), "handler": xla.library_available()}))
    """)
    code = code.replace("BENCHMARKS", repr(str(Path(__file__).resolve().parents[1] / "benchmarks")))
    env = _fresh(pnex_env, tmp_path, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    driver, _ = _run(code, dict(env, PNEX_LAUNCHER="driver"))
    handler, _ = _run(code, dict(env, PNEX_LAUNCHER="native"))
    assert not driver["handler"] and handler["handler"]
    assert driver["field"] == handler["field"]


REPORT = """
import json
import torch
from numba import cuda
import pnex_magic as pnex
from pnex_magic import report
from pnex_magic.launch import background, native, switch

lock = background.hold(native._target())  # as a build process holds it: the report comes first

@pnex.jit(n_threads="a.numel()")
def scale(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * 3.0

a = torch.randn(1 << 20, device="cuda")
waiting = switch.waiting(scale._pnex.op_name)
first = report.build_report(scale, args=(a,), eager=lambda a: a * 3.0, sass=False)
lock.close()
switch.wait(timeout=900)
second = report.build_report(scale, args=(a,), eager=lambda a: a * 3.0, sass=False)
t1, t2 = first.timing, second.timing
print("RESULT " + json.dumps({
    "waiting": waiting, "native_after": scale._native,
    "first_device": t1.device, "second_device": t2.device, "ok": [t1.correctness.ok, t2.correctness.ok],
    "medians": [t1.op.median, t1.eager.median, t2.op.median, t2.eager.median],
}), flush=True)
"""


def test_a_report_made_while_the_launcher_builds_times_graph_replays(tmp_path, pnex_env):
    """The first report in a fresh environment times the kernel, not the Python launcher's
    cost per call: the op and the reference as CUDA-graph replays, and it says so; once
    the C++ launcher serves, plain calls again."""
    record, _ = _run(REPORT, _fresh(pnex_env, tmp_path))
    assert record["waiting"] and record["native_after"], record
    assert "CUDA-graph replays" in record["first_device"] and "C++ launcher is being built" in record["first_device"]
    assert "CUDA-graph" not in record["second_device"] and "Python launcher" not in record["second_device"]
    assert record["ok"] == [True, True] and all(m > 0 for m in record["medians"])
