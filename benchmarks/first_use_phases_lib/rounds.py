"""The rounds of ``benchmarks/first_use_phases.py``: fresh processes per checkout and per
ablation, interleaved round by round."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

#: the command line, which runs each child (``--child``)
SCRIPT = Path(__file__).resolve().parents[1] / "first_use_phases.py"


# ----------------------------------------------------------------------------- rounds


def _run_child(device: str, salt: float, env: dict[str, str], warmup_at_import: bool = False,
               ablate: tuple[str, ...] = (), prepare: bool = False, heap: int = 0, threshold0: int = 0) -> dict:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", device, repr(salt)]
        + (["--warmup-at-import"] if warmup_at_import else []) + [f"--ablate={a}" for a in ablate]
        + (["--prepare"] if prepare else []) + ([f"--heap={heap}"] if heap else [])
        + ([f"--gc-threshold={threshold0}"] if threshold0 else []),
        capture_output=True, text=True, timeout=1200, env=env,
    )
    if done.returncode != 0 or "RESULT " not in done.stdout:
        raise RuntimeError(f"benchmark child failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])


def run_rounds(device: str, rounds: int, envs: dict[str, dict[str, str]], log=print,
               warmup_at_import: bool = False, ablations: tuple[str, ...] = (), heap: int = 0,
               threshold0: int = 0) -> dict[str, list[dict]]:
    """``rounds`` fresh processes per checkout (``envs``: a name and the environment that
    imports it) and per ablation of this checkout (``ablations``: each a
    ``+``-separated set of :func:`child`'s ``ablate``), interleaved round by round, so
    that load on a shared machine hits each; ``heap``, ``threshold0``: see :func:`child`."""
    variants = {name: (env, ()) for name, env in envs.items()}
    this = next(iter(envs.values()))
    for ablation in ablations:
        variants[f"without {ablation}"] = (this, tuple(ablation.split("+")))
    base = 1.0 + (time.time_ns() % 1_000_000) / 1e7  # new constants in every run of the script
    for k, env in enumerate(envs.values()):  # byte-compiled modules and (GPU) the C++ launcher exist before timing
        ready = _run_child(device, base - (k + 1) / 1024, env, prepare=True)
        if "launcher" in ready:
            log(f"  C++ launcher: {ready['launcher']}", flush=True)
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    for r in range(rounds):
        for k, (name, (env, ablate)) in enumerate(variants.items()):
            sample = _run_child(device, base + (r + 1) / 64 + k / 4096, env, warmup_at_import, ablate, heap=heap,
                                threshold0=threshold0)
            log(f"  round {r + 1}/{rounds} {name}: new kernel {sample['first']['seconds']:.3f} s, second "
                f"{sample['second']['seconds']:.3f} s, script {sample['script_s']:.3f} s", flush=True)
            samples[name].append(sample)
    return samples
