"""``pnex.Tune`` on a GPU: every block x Tune candidate launches correctly through both
GPU launchers, the tuner keeps the fastest with its time, and a new process reuses the
stored choice without timing anything.  Skipped where there is no NVIDIA GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import pnex_magic as pnex
from pnex_magic.launch import autotune

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def tuning(gpu_cache):
    fresh = gpu_cache
    autotune.stats.reset()
    yield fresh


KERNEL = '''
import pnex_magic as pnex
from numba import cuda, float32

@pnex.jit(n_threads="(a.numel() + ITEMS - 1) // ITEMS", threads_per_block=[128, 256, 512])
def tcopy(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a"), ITEMS: pnex.Tune(1, 2, 4, 8)):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    n = a.shape[0]
    v = cuda.local.array(ITEMS, float32)
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < n:
            v[k] = a[j]
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < n:
            r[j] = v[k]
'''


def _op(tmp_path: Path, source: str = KERNEL, module: str = "tcopy_kernel"):
    """The op ``tcopy`` of ``source``, written as module ``module`` (a kernel file of its own)."""
    path = tmp_path / f"{module}.py"
    path.write_text(source)
    namespace: dict = {"__name__": module}
    exec(compile(source, str(path), "exec"), namespace)  # noqa: S102 -- a kernel file of the test's own
    return namespace["tcopy"]


def test_every_candidate_launches_and_the_fastest_is_kept(tmp_path, launcher):
    op = _op(tmp_path)
    a = torch.randn(3_000_001, device="cuda")  # not a multiple of any block x ITEMS
    out = op(a)
    assert torch.equal(out, a)
    result = autotune.result_for(op.definition, (a,))
    assert result.source == "benchmarked" and result.seconds_total > 0
    assert len([c for c in result.candidates if c.seconds is not None]) == 12
    assert min(c.seconds for c in result.candidates if c.seconds) == result.candidates[result.choice].seconds
    if launcher == "native":
        from pnex_magic.launch.native import forced_candidate

        for index in range(len(op.spec.launch_candidates)):
            with forced_candidate(op.definition.op_name, index):
                assert torch.equal(op(a), a), op.spec.launch_candidates[index]
    report = pnex.build_report(op, args=(a,), eager=torch.clone)
    assert report.autotune.tune == result.tune and "ITEMS=" in "\n".join(report.lines())


def test_a_new_process_reuses_the_stored_choice(tmp_path, tuning):
    op = _op(tmp_path)
    a = torch.randn(1 << 20, device="cuda")
    op(a)
    chosen = autotune.result_for(op.definition, (a,))
    script = tmp_path / "again.py"
    script.write_text(textwrap.dedent(f'''
        import json, sys, torch
        sys.path.insert(0, {str(tmp_path)!r})
        from pnex_magic.launch import autotune
        import tcopy_kernel
        a = torch.randn(1 << 20, device="cuda")
        assert torch.equal(tcopy_kernel.tcopy(a), a)
        r = autotune.result_for(tcopy_kernel.tcopy.definition, (a,))
        print(json.dumps({{"benchmarks": autotune.stats.benchmarks, "disk_hits": autotune.stats.disk_hits,
                           "tune": r.tune, "block": r.block}}))
    '''))
    (tmp_path / "tcopy_kernel.py").write_text(KERNEL)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PNEX_CACHE_DIR": str(tuning)})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["benchmarks"] == 0 and found["disk_hits"] == 1
    assert [tuple(t) for t in found["tune"]] == list(chosen.tune) and tuple(found["block"]) == chosen.block


def test_only_the_kept_combinations_launch_and_are_timed(tmp_path, launcher):
    """``tune_requires``: the tuner times the kept combinations of ITEMS and UNROLL, each
    launches right through both launchers (forced one by one through the C++ one)."""
    source = KERNEL.replace('threads_per_block=[128, 256, 512])', 'threads_per_block=[128, 256], '
                            'tune_requires="ITEMS * UNROLL <= 4")').replace(
        'ITEMS: pnex.Tune(1, 2, 4, 8)):', 'ITEMS: pnex.Tune(1, 2, 4, 8), UNROLL: pnex.Tune(1, 2)):')
    assert source != KERNEL
    op = _op(tmp_path, source, "tcopy_rules")
    assert op.spec.tune_variants == ((1, 1), (1, 2), (2, 1), (2, 2), (4, 1))
    a = torch.randn(1_000_003, device="cuda")
    assert torch.equal(op(a), a)
    result = autotune.result_for(op.definition, (a,))
    assert result.source == "benchmarked"
    assert len([c for c in result.candidates if c.seconds is not None]) == 2 * 5
    assert dict(result.tune)["ITEMS"] * dict(result.tune)["UNROLL"] <= 4
    if launcher == "native":
        from pnex_magic.launch.native import forced_candidate

        for index in range(len(op.spec.launch_candidates)):
            with forced_candidate(op.definition.op_name, index):
                assert torch.equal(op(a), a), op.spec.launch_candidates[index]


def test_each_call_times_and_launches_only_the_combinations_it_keeps(tmp_path, launcher):
    """``tune_requires`` naming the call's sizes: three calls of one power-of-two bucket
    that keep other combinations are tuned apart, each timing only what it keeps; a call
    that keeps none is refused with the same words by both launchers."""
    rule = "a.size(0) % ITEMS == 0 and a.size(0) >= 1024 * ITEMS"
    source = KERNEL.replace('threads_per_block=[128, 256, 512])', 'threads_per_block=[128, 256], '
                            f'tune_requires={{"{rule}": "whole items"}})')
    assert source != KERNEL
    op = _op(tmp_path, source, "tcopy_per_call")
    for n, keeps in [(1_000_003, {1}), (1_000_002, {1, 2}), (1_048_576, {1, 2, 4, 8})]:
        a = torch.randn(n, device="cuda")
        assert torch.equal(op(a), a)
        result = autotune.result_for(op.definition, (a,))
        assert result.source == "benchmarked", n
        assert {dict(c.tune)["ITEMS"] for c in result.candidates if c.seconds is not None} == keeps, n
        assert dict(result.tune)["ITEMS"] in keeps
    assert autotune.stats.benchmarks == 3
    with pytest.raises(pnex.ArgumentValueError, match=(
            r"^tcopy\(\): the call breaks tune_requires `a.size\(0\) % ITEMS == 0 and a.size\(0\) >= 1024 \* ITEMS` "
            r"\(a.size\(0\) = 1000\): whole items; no combination of the Tune choices \(ITEMS=1; ITEMS=2; ITEMS=4; "
            r"ITEMS=8\) keeps it for this call$")):
        op(torch.randn(1000, device="cuda"))
    if launcher == "native":
        assert op._native, "the C++ launcher did not serve the op"
