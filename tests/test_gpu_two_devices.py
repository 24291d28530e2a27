"""GPU tests that need two GPUs (the device tool's ``nvidia-h200-x2``): an op whose first
call in a process is on ``cuda:1`` (each launcher loads its module per device), CUDA-graph
capture on ``cuda:1``, autotuning on ``cuda:1`` (the choice stored under that GPU's model
and reused on the other GPU when it is the same model), a ``Tune`` kernel and a checked
launch on ``cuda:1``.  Each case runs in a fresh process, so that nothing has touched
``cuda:0`` before it; every case runs with both GPU launchers.  Skipped with a reason
elsewhere.  The DDP job and the JAX second-device test live beside the other tests of
their front end (``test_gpu.py::test_ddp_two_processes``, ``test_jax.py::test_gpu_second_device``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

PRELUDE = textwrap.dedent(
    """
    import json, sys, torch
    from numba import cuda
    import pnex_magic as pnex
    from pnex_magic.launch import autotune

    @pnex.jit(n_threads="a.numel()", threads_per_block="auto")
    def axpb(a: pnex.In("f32", (None,)), s: float, out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * s + 1.0

    def check(out, a, s):
        ref = a.double() * s + 1.0
        err = (out.double() - ref).abs().max().item()
        tol = 1e-6 * ref.abs().max().item() + 1e-6
        if err > tol:
            raise SystemExit(f"wrong result on {out.device}: max error {err}")
    """
)


def _run(body: str, launcher: str, env: dict) -> dict:
    """Run PRELUDE + body as a script (a checked variant is built from a file's source) in a
    fresh interpreter; the last line it prints is JSON."""
    script = Path(env["PNEX_CACHE_DIR"]).parent / "two_devices_case.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = dict(env, PNEX_LAUNCHER=launcher)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(gpu_cache, pnex_env):
    return dict(pnex_env, PNEX_CACHE_DIR=str(gpu_cache))


@pytest.mark.parametrize("launcher", ["native", "driver"])
def test_first_call_on_the_second_gpu(launcher, env):
    facts = _run(
        """
        a1 = torch.randn(100_003, device="cuda:1")
        torch.cuda.synchronize(1)
        out1 = axpb(a1, 2.5)
        torch.cuda.synchronize(1)
        check(out1, a1, 2.5)
        # cuda:0 was never used before: the op's first call there loads its module again
        a0 = torch.randn(4097, device="cuda:0")
        out0 = axpb(a0, -1.5)
        check(out0, a0, -1.5)
        # a call on cuda:1 while cuda:0 is current runs on cuda:1's stream
        with torch.cuda.device(0):
            b1 = torch.randn(513, device="cuda:1")
            outb = axpb(b1, 3.0)
        check(outb, b1, 3.0)
        print(json.dumps({"devices": [str(out1.device), str(out0.device), str(outb.device)],
                          "native": axpb._native}))
        """,
        launcher, env,
    )
    assert facts["devices"] == ["cuda:1", "cuda:0", "cuda:1"]
    assert facts["native"] == (launcher == "native")


@pytest.mark.parametrize("launcher", ["native", "driver"])
def test_cuda_graph_capture_on_the_second_gpu(launcher, env):
    facts = _run(
        """
        a = torch.randn(1 << 16, device="cuda:1")
        out = axpb(a, 2.0)            # eager first: tunes and loads on cuda:1
        torch.cuda.synchronize(1)
        with torch.cuda.device(1):
            static = torch.randn(1 << 16, device="cuda:1")
            s = torch.cuda.Stream(device="cuda:1")
            s.wait_stream(torch.cuda.current_stream(1))
            with torch.cuda.stream(s):
                axpb(static, 2.0)
            torch.cuda.current_stream(1).wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                captured = axpb(static, 2.0)
            results = []
            for _ in range(3):
                fresh = torch.randn(1 << 16, device="cuda:1")
                static.copy_(fresh)
                captured.fill_(float("nan"))
                g.replay()
                torch.cuda.synchronize(1)
                check(captured, fresh, 2.0)
        print(json.dumps({"device": str(captured.device)}))
        """,
        launcher, env,
    )
    assert facts["device"] == "cuda:1"


@pytest.mark.parametrize("launcher", ["native", "driver"])
def test_autotune_on_the_second_gpu_is_stored_under_its_model(launcher, env):
    facts = _run(
        """
        a1 = torch.randn(1 << 20, device="cuda:1")
        check(axpb(a1, 2.0), a1, 2.0)
        result = autotune.result_for(axpb.definition, (a1, 2.0))
        tuned_on_1 = [autotune.stats.benchmarks, autotune.stats.disk_hits]
        # the same model on cuda:0: its choice is read back from the disk record, not re-timed
        a0 = torch.randn(1 << 20, device="cuda:0")
        check(axpb(a0, 2.0), a0, 2.0)
        result0 = autotune.result_for(axpb.definition, (a0, 2.0))
        print(json.dumps({"tuned_on_1": tuned_on_1, "after_0": [autotune.stats.benchmarks, autotune.stats.disk_hits],
                          "device": result.device, "source": result.source, "block": list(result.block),
                          "block0": list(result0.block), "names": [torch.cuda.get_device_name(i) for i in (0, 1)]}))
        """,
        launcher, env,
    )
    assert facts["tuned_on_1"] == [1, 0] and facts["source"] == "benchmarked"
    assert facts["device"] == facts["names"][1]
    stored = [json.loads(p.read_text()) for p in (Path(env["PNEX_CACHE_DIR"]) / "autotune").glob("*.json")]
    assert [r["gpu"] for r in stored] == [facts["names"][1]], stored
    if facts["names"][0] == facts["names"][1]:
        assert facts["after_0"] == [1, 1] and facts["block0"] == facts["block"]
    else:
        assert facts["after_0"] == [2, 0]


@pytest.mark.parametrize("launcher", ["native", "driver"])
def test_tune_and_checked_launch_on_the_second_gpu(launcher, env):
    facts = _run(
        """
        @pnex.jit(n_threads="(a.numel() + ITEMS - 1) // ITEMS", threads_per_block="auto")
        def copy(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a"), ITEMS: pnex.Tune(1, 4)):
            base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
            for k in range(ITEMS):
                j = base + k * cuda.blockDim.x
                if j < a.shape[0]:
                    r[j] = a[j]

        a = torch.randn(1 << 22, device="cuda:1")
        assert torch.equal(copy(a), a)
        tune = dict(autotune.result_for(copy.definition, (a,)).tune)

        @pnex.jit(n_threads="a.numel()", check=True)
        def off_by_one(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i <= a.shape[0]:
                out[i] = a[i - 1] if i > 0 else a[0]

        caught = ""
        try:
            off_by_one(torch.ones(1000, device="cuda:1"))
        except IndexError as exc:
            caught = str(exc)
        alive = torch.ones(4, device="cuda:1").sum().item() + torch.ones(4, device="cuda:0").sum().item()
        print(json.dumps({"tune": tune, "caught": caught, "alive": alive}))
        """,
        launcher, env,
    )
    assert facts["tune"]["ITEMS"] in (1, 4)
    assert "'out'" in facts["caught"] and "1000" in facts["caught"], facts["caught"]
    assert facts["alive"] == 8.0
