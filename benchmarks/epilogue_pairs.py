"""The fused GEMM + bias + GELU epilogue (issue 35), timed fairly: every contender in every
round, in a shuffled order, on the same inputs, with the SM clock and power read beside.

    python benchmarks/epilogue_pairs.py                      # 4096^3 and 4096x4096x16384
    python benchmarks/epilogue_pairs.py --shapes 8192,4096,4096 --rounds 30

``benchmarks/tensor_cores.py --only epilogue`` times eager PyTorch, then torch.compile, then
each pnex kernel, one after the other.  An H200 running matrix products is held by its power
limit (its SM clock moves with the load and the card's temperature), so what it measures
depends on the order.  Here each round times every contender once (``--loops`` calls between
two CUDA events) in an order drawn afresh, and ``nvidia-smi`` samples the SM clock and the
power draw every 50 ms in the background; each timing is given the mean clock of the samples
taken while it ran (most timings are shorter than 50 ms and have none), and each shape the
range of clocks and power over its rounds.

Contenders (float16): ``cublas`` (``F.linear(x, w)``: the product alone), ``eager``
(``F.gelu(F.linear(x, w, b))``), ``compile`` (``torch.compile`` of it), and the pnex TMA
and ping-pong kernels, plain (``tma``, ``pingpong``: the product alone) and fused with their
GELU (``tma_gelu_poly``, ``pingpong_gelu_poly``: :func:`epilogue.gelu_poly`, ``exp2`` of a
polynomial); on request the fused kernels with the erf form of the GELU (``tma_gelu``,
``pingpong_gelu``: libdevice's ``erff``) and with the bias only (``tma_bias``,
``pingpong_bias``: what the GELU's arithmetic costs).  The persistent TMA kernel likewise:
``persistent``, ``persistent_gelu_poly``, ``persistent_bias``, and in 2-block clusters
(W's tile multicast) ``persistent_cluster`` and ``persistent_cluster_gelu_poly``.  The ping-pong
kernel with a warpgroup's tile 64 x 256 (4 stages) instead of 128 x 128 (5): ``pingpong_wide``,
``pingpong_wide_gelu_poly``, ``pingpong_wide_bias``, and in 2-block clusters
``pingpong_wide_cluster``, ``pingpong_wide_cluster_gelu_poly``.  The persistent kernel with
``grouped_tile``'s groups of 4 or 16 row blocks instead of 8: ``persistent_g4``,
``persistent_g16`` and their ``*_gelu_poly``.  A fused kernel's
cost over its own product is the median over rounds of the difference within a round.
Every result is checked against float64 first; a wrong kernel is reported, not timed.

Prints a table and writes benchmarks/results/epilogue-pairs-<date>.json (GPU, versions,
date; per shape and contender: the median, quartiles and the median clock and power, and for
a fused one its ``product`` and ``over_product_us``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHAPES = [(4096, 4096, 4096), (4096, 4096, 16384)]
CONTENDERS = ("cublas", "eager", "compile", "tma", "tma_gelu", "pingpong", "pingpong_gelu", "tma_bias",
              "pingpong_bias", "tma_gelu_poly", "pingpong_gelu_poly", "persistent", "persistent_gelu_poly",
              "persistent_bias", "persistent_cluster", "persistent_cluster_gelu_poly", "pingpong_wide",
              "pingpong_wide_gelu_poly", "pingpong_wide_bias", "pingpong_wide_cluster",
              "pingpong_wide_cluster_gelu_poly", "persistent_g4", "persistent_g4_gelu_poly", "persistent_g16",
              "persistent_g16_gelu_poly")
DEFAULT = ("cublas", "eager", "compile", "tma", "tma_gelu_poly", "pingpong", "pingpong_gelu_poly")
FUSED = ("tma_gelu", "pingpong_gelu", "tma_gelu_poly", "pingpong_gelu_poly",
         "persistent_gelu_poly", "persistent_cluster_gelu_poly", "pingpong_wide_gelu_poly",
         "pingpong_wide_cluster_gelu_poly", "persistent_g4_gelu_poly", "persistent_g16_gelu_poly")  # not *_bias
EPILOGUES = ("_gelu_poly", "_gelu", "_bias")  # a fused contender's name: its product's, then one of these


def product_of(name: str) -> str | None:
    """The contender that computes ``name``'s product alone (``tma`` for ``tma_gelu_poly``,
    ``cublas`` for ``eager``), or None for a product itself."""
    if name == "eager":
        return "cublas"
    return next((name[: -len(end)] for end in EPILOGUES if name.endswith(end)), None)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", action="append", help="M,N,K (repeatable); default: 4096^3, 4096x4096x16384")
    p.add_argument("--contenders", default=",".join(DEFAULT),
                   help=f"comma-separated, of {','.join(CONTENDERS)} (default: {','.join(DEFAULT)}; *_gelu: "
                        "the erf form of the GELU, *_bias: the bias only, no GELU)")
    p.add_argument("--rounds", type=int, default=20, help="rounds (each times every contender once), default 20")
    p.add_argument("--loops", type=int, default=10, help="calls between the two CUDA events of one timing, default 10")
    p.add_argument("--no-write", action="store_true", help="print only; write no results file")
    return p.parse_args(argv)


class ClockSampler:
    """``nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu -lms 50`` in the
    background; each line is stamped with ``time.monotonic()`` as it arrives."""

    def __init__(self):
        self.samples: list[tuple[float, float, float, float]] = []
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
                 "-i", "0", "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                clock, power, temp = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), clock, power, temp))

    def between(self, t0: float, t1: float):
        """Mean (clock MHz, power W, temperature C) of the samples in [t0, t1], or Nones."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if not inside:
            return None, None, None
        return tuple(statistics.fmean(s[i] for s in inside) for i in (1, 2, 3))

    def stop(self):
        if self.proc:
            self.proc.terminate()


def contenders(names, torch):
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_pingpong import PingPongLinear
    from gemm_tma import TmaLinear

    def eager(x, w, b):
        return F.gelu(F.linear(x, w, b))

    def product(op):
        """A product-only op called as the fused ones are, ``(x, w, b)``."""
        return lambda x, w, b: op(x, w)

    build = {
        "cublas": lambda: (lambda x, w, b: F.linear(x, w), False),
        "eager": lambda: (eager, True),
        "compile": lambda: (torch.compile(eager, fullgraph=True), True),
        "tma": lambda: (product(TmaLinear("f16", 256, 4)), False),
        "tma_gelu": lambda: (TmaLinear("f16", 256, 4, gelu=True, activation="gelu"), True),
        "pingpong": lambda: (product(PingPongLinear("f16", 5)), False),
        "pingpong_gelu": lambda: (PingPongLinear("f16", 5, gelu=True, activation="gelu"), True),
        "tma_bias": lambda: (TmaLinear("f16", 256, 4, gelu=True, activation="bias"), "bias"),
        "pingpong_bias": lambda: (PingPongLinear("f16", 5, gelu=True, activation="bias"), "bias"),
        "tma_gelu_poly": lambda: (TmaLinear("f16", 256, 4, gelu=True, activation="gelu_poly"), True),
        "pingpong_gelu_poly": lambda: (PingPongLinear("f16", 5, gelu=True, activation="gelu_poly"), True),
        "persistent": lambda: (product(TmaLinear("f16", 256, 4, persistent=True)), False),
        "persistent_gelu_poly": lambda: (TmaLinear("f16", 256, 4, True, gelu=True, activation="gelu_poly"), True),
        "persistent_bias": lambda: (TmaLinear("f16", 256, 4, True, gelu=True, activation="bias"), "bias"),
        "persistent_cluster": lambda: (product(TmaLinear("f16", 256, 4, True, cluster=2)), False),
        "persistent_cluster_gelu_poly": lambda: (TmaLinear("f16", 256, 4, True, cluster=2, gelu=True), True),
        "persistent_g4": lambda: (product(TmaLinear("f16", 256, 4, True, group=4)), False),
        "persistent_g4_gelu_poly": lambda: (TmaLinear("f16", 256, 4, True, gelu=True, group=4), True),
        "persistent_g16": lambda: (product(TmaLinear("f16", 256, 4, True, group=16)), False),
        "persistent_g16_gelu_poly": lambda: (TmaLinear("f16", 256, 4, True, gelu=True, group=16), True),
        "pingpong_wide": lambda: (product(PingPongLinear("f16", 4, tile=(64, 256))), False),
        "pingpong_wide_gelu_poly": lambda: (PingPongLinear("f16", 4, gelu=True, tile=(64, 256)), True),
        "pingpong_wide_bias": lambda: (PingPongLinear("f16", 4, gelu=True, activation="bias", tile=(64, 256)), "bias"),
        "pingpong_wide_cluster": lambda: (product(PingPongLinear("f16", 4, tile=(64, 256), cluster=2)), False),
        "pingpong_wide_cluster_gelu_poly": lambda: (PingPongLinear("f16", 4, gelu=True, tile=(64, 256), cluster=2),
                                                    True),
    }
    return {name: build[name]() for name in names}


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


def run_shape(shape, fns, args, torch, sampler, rng):
    import torch.nn.functional as F
    from bench_common import interleaved_seconds

    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) / k ** 0.5
    b = torch.randn(n, device="cuda", dtype=torch.float16, generator=gen)
    product = x.double() @ w.double().t()
    refs = {False: product, True: F.gelu(product + b.double()), "bias": product + b.double()}
    row = {"m": m, "n": n, "k": k, "rounds": args.rounds, "loops": args.loops, "contenders": {}}
    live = {}
    for name, (fn, fused) in fns.items():
        try:
            out = fn(x, w, b)
            ref = refs[fused]
            err = float(torch.linalg.norm((out.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
        except Exception as exc:  # noqa: BLE001 - reported beside the others' figures
            row["contenders"][name] = {"note": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        row["contenders"][name] = {"error": err}
        if err < 2e-3:
            live[name] = fn
        else:
            row["contenders"][name]["note"] = "WRONG RESULT: not timed"
    samples = {name: [] for name in live}
    begun = time.monotonic()

    def note(name, seconds, t0, t1):
        samples[name].append((seconds * 1e6, *sampler.between(t0, t1)))

    interleaved_seconds(live, (x, w, b), args.rounds, args.loops, seed=rng.randrange(2**31), on_timing=note)
    during = [smp for smp in sampler.samples if smp[0] >= begun]
    if during:  # a timing (milliseconds) is shorter than nvidia-smi's 50 ms: most have no sample of their own
        row["clocks"] = {"sm_mhz_min": min(smp[1] for smp in during), "sm_mhz_median": statistics.median(
            smp[1] for smp in during), "sm_mhz_max": max(smp[1] for smp in during),
            "power_w_median": statistics.median(smp[2] for smp in during),
            "power_w_max": max(smp[2] for smp in during), "temperature_c_max": max(smp[3] for smp in during),
            "samples": len(during)}
    for name, got in samples.items():
        times = [s[0] for s in got]
        clocks = [s[1] for s in got if s[1] is not None]
        powers = [s[2] for s in got if s[2] is not None]
        q1, med, q3 = quartiles(times)
        row["contenders"][name].update(
            us=med, us_q1=q1, us_q3=q3, times_us=times,
            sm_mhz=statistics.median(clocks) if clocks else None,
            power_w=statistics.median(powers) if powers else None)
    for fused in samples:
        plain = product_of(fused)
        if plain in samples:
            row["contenders"][fused].update(product=plain, over_product_us=statistics.median(
                f[0] - p[0] for f, p in zip(samples[fused], samples[plain])))
    best = min((row["contenders"][c]["us"], c) for c in FUSED if c in samples) \
        if any(c in samples for c in FUSED) else None
    if best:
        row["pnex_kernel"] = best[1]
        for base in ("eager", "compile"):
            if base in samples:
                row[f"pnex_vs_{base}"] = row["contenders"][base]["us"] / best[0]
    return row


def main(argv=None):
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("epilogue_pairs.py needs an NVIDIA GPU (sm_90a: the TMA and ping-pong kernels): "
              "torch.cuda.is_available() is False")
        return 2
    sys.path.insert(0, str(HERE))
    from bench_common import launcher_ready, result_header, write_result

    print("launcher:", launcher_ready())
    names = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown:
        print(f"unknown contenders {unknown}; known: {', '.join(CONTENDERS)}")
        return 2
    result = result_header("epilogue-pairs")
    result["gpu_info"], result["gpu"] = result["gpu"], result["gpu"]["name"]
    result["method"] = (f"{args.rounds} rounds; each times every contender once ({args.loops} calls between CUDA "
                        "events) in a shuffled order; SM clock and power from nvidia-smi every 50 ms")
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else SHAPES
    sampler = ClockSampler()
    rng = random.Random(0)
    fns = contenders(names, torch)
    result["rows"] = []
    try:
        for shape in shapes:
            result["rows"].append(run_shape(shape, fns, args, torch, sampler, rng))
    finally:
        sampler.stop()
    print(f"{'shape':>18} {'contender':>14} {'median us':>10} {'q1':>8} {'q3':>8} {'SM MHz':>7} {'W':>5}")
    for row in result["rows"]:
        shape = f"{row['m']}x{row['n']}x{row['k']}"
        for name, c in row["contenders"].items():
            if "us" not in c:
                print(f"{shape:>18} {name:>14} {c.get('note', '')}")
                continue
            print(f"{shape:>18} {name:>14} {c['us']:10.1f} {c['us_q1']:8.1f} {c['us_q3']:8.1f} "
                  f"{c['sm_mhz'] or 0:7.0f} {c['power_w'] or 0:5.0f}")
        extras = ", ".join(f"{name} over {c['product']} {c['over_product_us']:+.1f} us"
                           for name, c in row["contenders"].items() if "product" in c)
        ratios = ", ".join(f"{key} {row[key]:.3f}x" for key in row if key.startswith("pnex_vs_"))
        print(f"{shape:>18} paired: {extras}; fastest pnex {row.get('pnex_kernel')}: {ratios}")
        if "clocks" in row:
            k = row["clocks"]
            print(f"{shape:>18} while timed: SM {k['sm_mhz_min']:.0f}-{k['sm_mhz_max']:.0f} MHz (median "
                  f"{k['sm_mhz_median']:.0f}), power median {k['power_w_median']:.0f} W, max {k['power_w_max']:.0f} W, "
                  f"{k['temperature_c_max']:.0f} C at most ({k['samples']} samples)")
    if not args.no_write:
        print("wrote", write_result(result, "epilogue-pairs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
