"""JAX: per-call cost, device time and first use of pnex kernels inside ``jax.jit``.

    python benchmarks/jax_overhead.py        # on a machine with an NVIDIA GPU, JAX's CUDA plugin and PyTorch

The goals of issue 9, measured in one run on one GPU:

  * per call (µs) of a jitted function on 1024 float32 elements, synchronised after
    every call (``block_until_ready``), median of 7 x 2000 calls: ``x + 1`` and
    ``x * y + x`` as jnp, and the same two as one pnex kernel each, launched by XLA
    through pnex's FFI handler; goal: pnex at most 1.1x the jnp function.  The same
    calls pipelined (one sync at the end) are reported too;
  * device time of a 1 GiB ``a*b+c`` kernel (1 GiB per array): the pnex kernel
    through JAX against the same kernel through the PyTorch op, both timed as 10
    back-to-back calls then one sync (wall clock, median of 10; the PyTorch op also
    by CUDA events); goal: JAX at least 0.98x the PyTorch op's speed.  XLA's own
    fused ``a*b+c`` is shown for reference;
  * first use: a new kernel from the start of its definition to its first result in
    JAX (goal: within 1 s), and an unchanged kernel again (cache; goal: within
    0.5 s), each in a fresh process whose environment already has the FFI handler
    built and in which JAX and PyTorch have initialised the GPU.

Prints a table last and writes JSON (GPU, driver, versions, date, every sample) to
``benchmarks/results/jax-overhead-<date>.json``; with ``$OUT`` set, also a log there.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # PyTorch shares the GPU

import datetime as _dt  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import device_seconds, gpu_info, versions  # noqa: E402

N_SMALL = 1024
N_LARGE = (1 << 30) // 4  # 1 GiB of float32 per array

KERNELS = textwrap.dedent(
    """
    import pnex_magic as pnex
    from numba import cuda

    @pnex.jit(n_threads="x.numel()")
    def add_one(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)  # SALT
        if i < x.shape[0]:
            out[i] = x[i] + 1

    @pnex.jit(n_threads="x.numel()")
    def mul_add_self(x: pnex.In("f32", (None,)), y: pnex.In("f32", "x"), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] * y[i] + x[i]

    @pnex.jit(n_threads="a.numel()")
    def muladd(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"),
               result: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            result[i] = a[i] * b[i] + c[i]
    """
)

FIRST_USE = textwrap.dedent(
    """
    import os, time
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import torch, jax, jax.numpy as jnp
    torch.ones(1, device="cuda"); torch.cuda.synchronize()
    x = jnp.ones(1024, jnp.float32); x.block_until_ready()
    t0 = time.perf_counter()
    import pnex_magic as pnex
    from numba import cuda

    @pnex.jit(n_threads="x.numel()")
    def add_one(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)  # SALT
        if i < x.shape[0]:
            out[i] = x[i] + 1

    y = jax.jit(pnex.jax_op(add_one))(x)
    y.block_until_ready()
    elapsed = time.perf_counter() - t0
    assert float(y[0]) == 2.0
    print(elapsed)
    """
)


def log(*parts) -> None:
    text = " ".join(str(p) for p in parts)
    print(text, flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(Path(out) / "jax_overhead.log", "a") as f:
            f.write(text + "\n")


def per_call_us(fn, args, *, calls: int = 2000, repeats: int = 7, sync_each: bool = True) -> tuple[float, list]:
    """Median over repeats of host time per call: ``calls`` calls, each synchronised
    (``sync_each``) or one sync at the end."""
    for _ in range(100):
        fn(*args).block_until_ready()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        if sync_each:
            for _ in range(calls):
                fn(*args).block_until_ready()
        else:
            for _ in range(calls):
                out = fn(*args)
            out.block_until_ready()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples), samples


def back_to_back_ms(fn, args, sync, *, calls: int = 10, repeats: int = 10) -> tuple[float, list]:
    """Median over repeats of (``calls`` back-to-back calls, then ``sync()``) / calls."""
    for _ in range(3):
        fn(*args)
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        sync(out)
        samples.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(samples), samples


def first_use(salt: str) -> float:
    code = FIRST_USE.replace("SALT", salt)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip()[-1500:])
    return float(out.stdout.strip().splitlines()[-1])


def hlo_summary(jitted, *args) -> dict:
    """What XLA compiled: custom calls and conditionals left in the optimised HLO."""
    text = jitted.lower(*args).compile().as_text()
    return {"custom_calls": text.count("custom-call("), "conditionals": text.count("conditional("),
            "pnex_target": "pnex_magic_launch" in text}


def per_call(result: dict, ns: dict) -> None:
    """Jitted functions on 1024 float32: jnp against one pnex kernel (goal: at most 1.1x)."""
    import jax
    import jax.numpy as jnp

    import pnex_magic as pnex

    rows: list[dict] = []
    result["per_call"] = rows
    x = jax.random.normal(jax.random.key(0), (N_SMALL,), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (N_SMALL,), jnp.float32)
    add_one, mul_add_self = pnex.jax_op(ns["add_one"]), pnex.jax_op(ns["mul_add_self"])
    variants = [
        ("jnp x + 1", jax.jit(lambda x: x + 1), (x,), None),
        ("pnex x + 1 (one kernel, XLA FFI)", jax.jit(lambda x: add_one(x)), (x,), "jnp x + 1"),
        ("jnp x * y + x", jax.jit(lambda x, y: x * y + x), (x, y), None),
        ("pnex x * y + x (one kernel, XLA FFI)", jax.jit(lambda x, y: mul_add_self(x, y)), (x, y), "jnp x * y + x"),
    ]
    base: dict[str, float] = {}
    for name, fn, args, versus in variants:
        expected = args[0] + 1 if len(args) == 1 else args[0] * args[1] + args[0]
        if not bool(jnp.allclose(fn(*args), expected, rtol=1e-6)):
            raise AssertionError(f"{name}: wrong result")
        synced, synced_samples = per_call_us(fn, args)
        piped, piped_samples = per_call_us(fn, args, sync_each=False)
        row = {"route": name, "us_per_call": synced, "us_per_call_pipelined": piped,
               "samples": synced_samples, "samples_pipelined": piped_samples, "hlo": hlo_summary(fn, *args)}
        base[name] = synced
        if versus is not None:
            row["ratio_vs_jnp"] = synced / base[versus]
            row["goal_met"] = row["ratio_vs_jnp"] <= 1.1
        rows.append(row)
        log(f"{name:40s} {synced:7.2f} µs/call synced, {piped:7.2f} pipelined, hlo {row['hlo']}")


def device_time(result: dict, ns: dict) -> None:
    """1 GiB a*b+c: the pnex kernel through JAX against the PyTorch op (goal: at least 0.98x)."""
    import jax
    import jax.numpy as jnp

    import pnex_magic as pnex

    device: dict = {}
    result["device_1gib_muladd"] = device
    keys = jax.random.split(jax.random.key(2), 3)
    a, b, c = (jax.random.normal(k, (N_LARGE,), jnp.float32) for k in keys)
    jax_pnex = jax.jit(pnex.jax_op(ns["muladd"]))
    jax_xla = jax.jit(lambda a, b, c: a * b + c)
    got = jax_pnex(a, b, c)
    if not bool(jnp.array_equal(got[: 1 << 20], (a * b + c)[: 1 << 20])):
        raise AssertionError("pnex through JAX: wrong result")
    del got

    def jax_sync(out=None):
        if out is not None:
            out.block_until_ready()

    device["jax_pnex_ms"], device["jax_pnex_samples"] = back_to_back_ms(jax_pnex, (a, b, c), jax_sync)
    device["jax_xla_fused_ms"], device["jax_xla_samples"] = back_to_back_ms(jax_xla, (a, b, c), jax_sync)
    del a, b, c
    ta, tb, tc = (torch.randn(N_LARGE, device="cuda") for _ in range(3))
    op = ns["muladd"]
    torch.testing.assert_close(op(ta, tb, tc), ta * tb + tc)
    device["torch_op_ms"], device["torch_op_samples"] = back_to_back_ms(
        op, (ta, tb, tc), lambda out=None: torch.cuda.synchronize()
    )
    device["torch_op_event_ms"] = device_seconds(op, (ta, tb, tc)) * 1e3
    device["speed_jax_vs_torch"] = device["torch_op_ms"] / device["jax_pnex_ms"]
    device["goal_met"] = device["speed_jax_vs_torch"] >= 0.98
    device["TBps_jax_pnex"] = 4 * N_LARGE * 4 / (device["jax_pnex_ms"] * 1e-3) / 1e12
    log(f"1 GiB a*b+c: JAX {device['jax_pnex_ms']:.3f} ms, PyTorch op {device['torch_op_ms']:.3f} ms "
        f"(events {device['torch_op_event_ms']:.3f} ms), XLA fused {device['jax_xla_fused_ms']:.3f} ms; "
        f"JAX speed {device['speed_jax_vs_torch']:.3f}x the PyTorch op's")
    del ta, tb, tc
    torch.cuda.empty_cache()


def first_uses(result: dict, ns: dict) -> None:
    """A new kernel in fresh processes, then the same kernel again (from the cache)."""
    first: dict = {}
    result["first_use"] = first
    salt = f"salt {time.time_ns()}"
    first["new_kernel_s"] = first_use(salt)
    first["cached_kernel_s"] = first_use(salt)
    first["goal_met"] = first["new_kernel_s"] <= 1.0 and first["cached_kernel_s"] <= 0.5
    log(f"first use in JAX: new kernel {first['new_kernel_s']:.2f} s, unchanged kernel {first['cached_kernel_s']:.2f} s")


def main() -> int:
    import argparse  # parse before looking for a GPU: --help works anywhere

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if not torch.cuda.is_available():
        print("jax_overhead.py needs an NVIDIA GPU; nothing measured.")
        return 1
    import jax

    from pnex_magic.launch import xla

    if not any(d.platform == "gpu" or d.platform == "cuda" for d in jax.devices()):
        print(f"JAX sees no GPU ({jax.devices()}); install JAX's CUDA plugin (pip install 'jax[cuda13]').")
        return 1
    result: dict = {
        "benchmark": "jax_overhead",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu_info(),
        "versions": {**versions(), **{d: _version(d) for d in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin")}},
        "jax_device": str(jax.devices()[0]),
        "errors": [],
    }
    log("JAX", jax.__version__, "on", result["jax_device"], "| GPU", result["gpu"])
    t0 = time.perf_counter()
    xla.build_library()
    result["ffi_build_s"] = time.perf_counter() - t0
    ns: dict = {}
    exec(KERNELS.replace("SALT", "in process"), ns)

    for name, section in (("per call", per_call), ("device time", device_time), ("first use", first_uses)):
        try:
            section(result, ns)
        except Exception as exc:  # report it, and go on with the other sections
            result["errors"].append(f"{name}: {traceback.format_exc()}")
            log(f"{name}: FAILED {type(exc).__name__}: {exc}")

    RESULTS.mkdir(exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    path = RESULTS / f"jax-overhead-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / path.name).write_text(json.dumps(result, indent=1))
    print()
    print(format_table(result))
    print(f"\nwritten to {path}")
    return 0 if not result["errors"] else 2


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _goal(met) -> str:
    return "" if met is None else ("met" if met else "MISSED")


def format_table(result: dict) -> str:
    lines = [f"JAX {result['versions'].get('jax')} on {result['gpu'].get('name')} "
             f"(driver {result['gpu'].get('driver')}), {result['date']}", ""]
    lines.append(f"{'jitted function, 1024 float32':40s} {'µs/call':>8s} {'pipelined':>10s} {'vs jnp':>7s}  goal ≤1.1x")
    for row in result.get("per_call", []):
        ratio = f"{row['ratio_vs_jnp']:.2f}x" if "ratio_vs_jnp" in row else ""
        lines.append(f"{row['route']:40s} {row['us_per_call']:8.2f} {row['us_per_call_pipelined']:10.2f} "
                     f"{ratio:>7s}  {_goal(row.get('goal_met'))}")
    d = result.get("device_1gib_muladd", {})
    if "speed_jax_vs_torch" in d:
        lines += ["", "1 GiB a*b+c, ms per call (10 back-to-back calls, one sync)",
                  f"  pnex kernel through JAX      {d['jax_pnex_ms']:.3f}  ({d['TBps_jax_pnex']:.2f} TB/s)",
                  f"  same kernel, PyTorch op      {d['torch_op_ms']:.3f}  (CUDA events {d['torch_op_event_ms']:.3f})",
                  f"  XLA's fused a*b+c            {d['jax_xla_fused_ms']:.3f}",
                  f"  JAX speed vs PyTorch op      {d['speed_jax_vs_torch']:.3f}x  goal ≥0.98x: {_goal(d['goal_met'])}"]
    f = result.get("first_use", {})
    if "new_kernel_s" in f:
        lines += ["", f"first use in JAX: new kernel {f['new_kernel_s']:.2f} s (goal ≤1 s), unchanged kernel "
                      f"{f['cached_kernel_s']:.2f} s (goal ≤0.5 s): {_goal(f['goal_met'])}"]
    if result.get("errors"):
        lines += ["", f"{len(result['errors'])} part(s) FAILED; see the JSON's errors"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
