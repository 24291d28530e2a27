"""Per-call overhead, first-use time and device time of pnex ops against every peer, in one run.

    python benchmarks/overhead.py                    # on a machine with an NVIDIA GPU
    python benchmarks/overhead.py --signatures-only  # the signature table and the LLTM row only
    python benchmarks/overhead.py --help             # anywhere

Robust on a shared machine: every table is measured in ``--rounds`` (5) interleaved
rounds (each round measures every row once, starting one row further on), a row's
figure is the minimum of its rounds' medians, and a goal is also judged round by round.

Rows, all in one run on one GPU:

* **per call by signature** (µs, tiny tensors: host-bound) against the closest native op:
  1-D copy vs ``torch.clone``; 2-D, two tensors and two scalars vs ``torch.addcmul``; 3-D,
  four tensors vs ``torch.addcmul``; 2-D, five tensors and two scalars vs
  ``torch.addcmul(value=s)``; an ``InMut`` in-place add vs ``Tensor.add_``.  Goal: at most
  1.05x.  Beside each, the split of pnex's cost (all measured, each as its own row):
  the op object (``PnexOp.__call__``: Python checks), ``torch.ops.pnex.<name>.default``
  (the same call without them), its ``._op`` (without ``OpOverload.__call__``'s Python
  frame), the op under ``torch.inference_mode()`` (no autograd kernel), and the same
  for the native op (``torch.ops.aten.<op>`` for the boxed route), plus device times;
* **LLTM 16/32/128 forward+backward** (workloads.py's) against eager and every
  ``torch.compile`` mode (default, reduce-overhead, max-autotune,
  max-autotune-no-cudagraphs; ``--skip-max-autotune`` drops the last two): goal,
  the fastest pnex variant faster than all of them in every round;
* **first use**, each in fresh processes (benchmarks/first_use.py): ``import pnex_magic``,
  a new kernel (its cache key made new by a constant it reads, checked by the cache's
  counters), the unchanged kernel again (a cache hit), ``pnex.load``, and a ``%%pnex``
  cell in a fresh Jupyter kernel (with and without the background warm-up);
* **per call of a 1024-element float32 copy** in a host loop: ``torch.clone``, pnex
  (``to_extension=True`` and ``False``: one C++ launcher serves both), pnex's Python
  driver launcher, pytorch-numba-extension-jit 0.1.6 (both modes, if installed), a raw
  numba-cuda launch, a Triton kernel, a hand-written CUDA op (``load_inline`` +
  ``TORCH_LIBRARY``), CUDA-graph replay of one clone;
* **device time** (CUDA events) of a 1 GiB copy and a 1 GiB a*b+c: pnex's kernel against
  a hand-written CUDA C++ kernel with the same algorithm and launch configuration.

Prints the tables (last) and writes JSON (GPU, driver, versions, date) to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import textwrap
import time
from collections.abc import Callable

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROUNDS = 5


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds of every row (default {ROUNDS})")
    parser.add_argument("--signatures-only", action="store_true", help="only the signature table and the LLTM row")
    parser.add_argument("--skip-lltm", action="store_true", help="skip the LLTM row")
    parser.add_argument("--skip-max-autotune", action="store_true",
                        help="LLTM: compile the eager model in the default and reduce-overhead modes only")
    parser.add_argument("--skip-first-use", action="store_true", help="skip the first-use rows (fresh processes)")
    parser.add_argument("--no-notebook", action="store_true", help="first use: skip the Jupyter-kernel rows")
    parser.add_argument("--skip-old", action="store_true", help="skip pytorch-numba-extension-jit")
    parser.add_argument("--skip-load-inline", action="store_true", help="skip the hand-written CUDA op")
    return parser


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    build_parser().parse_args()  # prints the help and exits, before the imports below (no torch needed)

import torch  # noqa: E402

from bench_common import device_seconds, gpu_info, result_header, versions, write_result  # noqa: E402

__all__ = ["per_call_us", "per_call_args_us", "device_ms", "device_seconds", "gpu_info", "versions", "rounds_of",
           "signature_table", "main", "GOAL", "build_parser"]

N_SMALL = 1024
GOAL = 1.05  # pnex per call / the closest native op's


def per_call_us(fn, arg, calls: int = 2000, repeats: int = 7) -> float:
    """Median over repeats of (host time for `calls` calls, then a sync) / calls."""
    for _ in range(50):
        fn(arg)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(arg)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def per_call_args_us(fn, args, calls: int = 2000, repeats: int = 7) -> float:
    return per_call_us(lambda packed: fn(*packed), args, calls, repeats)


def device_ms(fn, args, repeats: int = 20) -> float:
    """Median device time of one call ``fn(*args)`` in milliseconds (CUDA events)."""
    return device_seconds(fn, args, repeats) * 1e3


def rounds_of(measurements: dict[str, Callable[[], float]], rounds: int, log: Callable[[str], None] = print
              ) -> dict[str, list[float]]:
    """Every measurement once per round, interleaved (round r starts at the r-th one);
    returns each one's figures in round order."""
    names = list(measurements)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        start = r % len(names)
        for name in names[start:] + names[:start]:
            out[name].append(measurements[name]())
        log(f"  round {r + 1}/{rounds} done")
    return out


PNEX_DEFS = textwrap.dedent(
    """
    import torch, pnex_magic as pnex
    from numba import cuda

    @pnex.jit(n_threads="a.numel()", to_extension=TO_EXT)
    def copy(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
        x = cuda.grid(1)
        if x < a.shape[0]:
            result[x] = a[x]

    @pnex.jit(n_threads="a.numel()", to_extension=TO_EXT)
    def muladd(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"),
               result: pnex.Out("f32", "a")):
        x = cuda.grid(1)
        if x < a.shape[0]:
            result[x] = a[x] * b[x] + c[x]
    """
)

CUDA_SRC = r"""
#include <torch/extension.h>
#include <torch/library.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

__global__ void copy_kernel(const float* __restrict__ a, float* __restrict__ out, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i];
}
__global__ void muladd_kernel(const float* __restrict__ a, const float* __restrict__ b,
                              const float* __restrict__ c, float* __restrict__ out, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * b[i] + c[i];
}
at::Tensor hand_copy(const at::Tensor& a) {
  TORCH_CHECK(a.is_cuda() && a.scalar_type() == at::kFloat && a.is_contiguous());
  c10::cuda::CUDAGuard g(a.device());
  auto out = at::empty_like(a);
  int64_t n = a.numel();
  copy_kernel<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(a.data_ptr<float>(), out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
at::Tensor hand_muladd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  c10::cuda::CUDAGuard g(a.device());
  auto out = at::empty_like(a);
  int64_t n = a.numel();
  muladd_kernel<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
TORCH_LIBRARY(handwritten, m) {
  m.def("copy(Tensor a) -> Tensor");
  m.def("muladd(Tensor a, Tensor b, Tensor c) -> Tensor");
}
TORCH_LIBRARY_IMPL(handwritten, CUDA, m) {
  m.impl("copy", &hand_copy);
  m.impl("muladd", &hand_muladd);
}
"""

SIGNATURE_DEFS = textwrap.dedent(
    """
    import torch, pnex_magic as pnex
    from numba import cuda

    @pnex.jit(n_threads="a.numel()")
    def sig_copy(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
        x = cuda.grid(1)
        if x < a.shape[0]:
            result[x] = a[x]

    @pnex.jit(n_threads=("result.size(1)", "result.size(0)"))
    def sig_2d_scalars(a: pnex.In("f32", (None, None)), b: pnex.In("f32", "a"), s: float, t: float,
                       result: pnex.Out("f32", "a")):
        x, y = cuda.grid(2)
        if y < result.shape[0] and x < result.shape[1]:
            result[y, x] = a[y, x] + s * a[y, x] * b[y, x] + t

    @pnex.jit(n_threads=("result.size(2)", "result.size(1)", "result.size(0)"))
    def sig_3d_four(a: pnex.In("f32", (None, None, None)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"),
                    d: pnex.In("f32", "a"), result: pnex.Out("f32", "a")):
        x, y, z = cuda.grid(3)
        if z < result.shape[0] and y < result.shape[1] and x < result.shape[2]:
            result[z, y, x] = a[z, y, x] + b[z, y, x] * c[z, y, x] + d[z, y, x]

    @pnex.jit(n_threads=("result.size(1)", "result.size(0)"))
    def sig_2d_eight(a: pnex.In("f32", (None, None)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"),
                     d: pnex.In("f32", "a"), e: pnex.In("f32", "a"), s: float, t: int,
                     result: pnex.Out("f32", "a")):
        x, y = cuda.grid(2)
        if y < result.shape[0] and x < result.shape[1]:
            result[y, x] = a[y, x] * b[y, x] + c[y, x] * d[y, x] + e[y, x] * s + t

    @pnex.jit(n_threads="x.numel()")
    def sig_inmut(x: pnex.InMut("f32", (None,)), y: pnex.In("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += y[i]
    """
)


def _signature_cases(ns: dict) -> list[tuple[str, str, object, object, object, tuple, Callable]]:
    """(signature, native op's name, pnex op, native callable, the native op through
    torch.ops.aten (the dispatcher's boxed route, as a pnex op is called), arguments,
    the expected result)."""
    v = lambda *shape: torch.randn(*shape, device="cuda")  # noqa: E731
    aten = torch.ops.aten
    a2, b2 = v(32, 32), v(32, 32)
    a3 = [v(4, 16, 16) for _ in range(4)]
    five = [v(32, 32) for _ in range(5)]
    x, y = v(N_SMALL), v(N_SMALL)
    c = v(N_SMALL)
    return [
        ("1-D copy", "torch.clone", ns["sig_copy"], torch.clone, aten.clone.default, (c,), lambda: c),
        ("2-D, 2 tensors + 2 scalars", "torch.addcmul(a, a, b, value=s)", ns["sig_2d_scalars"],
         lambda a, b, s, t: torch.addcmul(a, a, b, value=s),
         lambda a, b, s, t: aten.addcmul.default(a, a, b, value=s), (a2, b2, 0.5, 0.25),
         lambda: a2 + 0.5 * a2 * b2 + 0.25),
        ("3-D, 4 tensors", "torch.addcmul(a, b, c)", ns["sig_3d_four"],
         lambda a, b, c, d: torch.addcmul(a, b, c), lambda a, b, c, d: aten.addcmul.default(a, b, c), tuple(a3),
         lambda: a3[0] + a3[1] * a3[2] + a3[3]),
        ("2-D, 5 tensors + 2 scalars", "torch.addcmul(a, b, c, value=s)", ns["sig_2d_eight"],
         lambda a, b, c, d, e, s, t: torch.addcmul(a, b, c, value=s),
         lambda a, b, c, d, e, s, t: aten.addcmul.default(a, b, c, value=s), (*five, 0.5, 3),
         lambda: five[0] * five[1] + five[2] * five[3] + five[4] * 0.5 + 3),
        ("InMut in-place add", "Tensor.add_", ns["sig_inmut"], lambda x, y: x.add_(y),
         lambda x, y: aten.add_.Tensor(x, y), (x, y), lambda: None),
    ]


def _inference(fn: Callable, args: tuple) -> float:
    with torch.inference_mode():
        return per_call_args_us(fn, args)


def device_us_per_call(fn, args, loops: int = 200) -> float:
    """Device time of one call, back to back (the stream is kept busy while the host
    queues the calls, so host overhead does not count)."""
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        torch.cuda._sleep(int(loops * 50e-6 * 2e9))  # ~50 µs of host time per call, at most ~2 GHz
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(loops):
            fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / loops)
    return statistics.median(times)


SPLIT = {  # column: what it measures
    "pnex_us": "the op object (PnexOp.__call__)",
    "torch_ops_us": "torch.ops.pnex.<name>.default (no PnexOp checks)",
    "cpp_entry_us": "torch.ops.pnex.<name>.default._op (no OpOverload.__call__ frame)",
    "pnex_inference_us": "the op object in torch.inference_mode() (no autograd kernel)",
    "native_us": "the native op",
    "native_boxed_us": "the native op through torch.ops.aten (the boxed route)",
    "native_inference_us": "the native op in torch.inference_mode()",
}


def signature_table(rounds: int = ROUNDS) -> list[dict]:
    """Per-call overhead of each signature against its closest native op, with the
    split of pnex's cost, in interleaved rounds."""
    ns: dict = {}
    exec(SIGNATURE_DEFS, ns)  # the kernels' one place; exec'd so that they stay module-free
    cases = _signature_cases(ns)
    measurements: dict[str, Callable[[], float]] = {}
    for signature, _, op, native, boxed, args, expected in cases:
        if signature.startswith("InMut"):
            check, reference = args[0].clone(), args[0].clone()
            op(check, args[1])
            native(reference, args[1])
            torch.testing.assert_close(check, reference)
        else:
            torch.testing.assert_close(op(*args), expected())
            torch.testing.assert_close(boxed(*args), native(*args))
        overload = getattr(torch.ops.pnex, op.definition.op_name).default
        variants = {
            "pnex_us": lambda op=op, args=args: per_call_args_us(op, args),
            "torch_ops_us": lambda f=overload, args=args: per_call_args_us(f, args),
            "cpp_entry_us": lambda f=overload._op, args=args: per_call_args_us(f, args),
            "pnex_inference_us": lambda op=op, args=args: _inference(op, args),
            "native_us": lambda f=native, args=args: per_call_args_us(f, args),
            "native_boxed_us": lambda f=boxed, args=args: per_call_args_us(f, args),
            "native_inference_us": lambda f=native, args=args: _inference(f, args),
        }
        for column, fn in variants.items():
            measurements[f"{signature}|{column}"] = fn
    print(f"signature table: {len(cases)} signatures x {len(SPLIT)} routes, {rounds} interleaved rounds", flush=True)
    figures = rounds_of(measurements, rounds)
    rows = []
    for signature, native_name, op, native, _, args, _ in cases:
        row: dict = {"signature": signature, "native": native_name, "params": len(op.spec.params)}
        for column in SPLIT:
            runs = figures[f"{signature}|{column}"]
            row[column] = min(runs)
            row[column.replace("_us", "_rounds")] = runs
        row["ratio"] = row["pnex_us"] / row["native_us"]
        row["round_ratios"] = [p / n for p, n in zip(row["pnex_rounds"], row["native_rounds"])]
        row["rounds_within_goal"] = sum(r <= GOAL for r in row["round_ratios"])
        row["pnex_device_us"] = device_us_per_call(op, args)
        row["native_device_us"] = device_us_per_call(native, args)
        rows.append(row)
    return rows


def print_signature_table(rows: list[dict]) -> None:
    rounds = len(rows[0]["round_ratios"]) if rows else 0
    print(f"\nper-call overhead by signature, µs (minimum of {rounds} rounds' medians; goal: pnex at most "
          f"{GOAL:.2f}x the closest native op)")
    print(f"{'signature':28s} {'params':>6} {'pnex':>7} {'native':>7} {'ratio':>6} {'rounds ok':>9}  native op")
    for r in rows:
        flag = "" if r["ratio"] <= GOAL else "  (over the goal)"
        print(f"{r['signature']:28s} {r['params']:>6} {r['pnex_us']:7.2f} {r['native_us']:7.2f} {r['ratio']:6.3f} "
              f"{r['rounds_within_goal']:>4} of {len(r['round_ratios'])}  {r['native']}{flag}")
    print("\nwhere pnex's time goes, µs (each route measured; differences are estimates):")
    print(f"{'signature':28s} {'op obj':>7} {'t.ops':>7} {'._op':>7} {'no-AG':>7} | {'native':>7} {'aten':>7} "
          f"{'no-AG':>7} | {'checks':>6} {'frame':>6} {'AG pnex':>7} {'AG nat':>6} {'dev pnex':>8} {'dev nat':>7}")
    for r in rows:
        print(f"{r['signature']:28s} {r['pnex_us']:7.2f} {r['torch_ops_us']:7.2f} {r['cpp_entry_us']:7.2f} "
              f"{r['pnex_inference_us']:7.2f} | {r['native_us']:7.2f} {r['native_boxed_us']:7.2f} "
              f"{r['native_inference_us']:7.2f} | {r['pnex_us'] - r['torch_ops_us']:6.2f} "
              f"{r['torch_ops_us'] - r['cpp_entry_us']:6.2f} {r['pnex_us'] - r['pnex_inference_us']:7.2f} "
              f"{r['native_us'] - r['native_inference_us']:6.2f} {r['pnex_device_us']:8.2f} {r['native_device_us']:7.2f}")
    print("  op obj: PnexOp.__call__; t.ops: torch.ops.pnex.<name>.default; ._op: its C++ callable; no-AG: in "
          "torch.inference_mode(); aten: torch.ops.aten.<op>; checks = op obj - t.ops; frame = t.ops - ._op; "
          "AG = time of the autograd kernel (normal - inference mode)")


def lltm_rows(rounds: int, skip_max_autotune: bool) -> dict:
    """workloads.py's LLTM 16/32/128 forward+backward against eager and every
    torch.compile mode, in interleaved rounds."""
    import workloads as wl

    modes = ("default", "reduce-overhead") if skip_max_autotune else (
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    wl._TRACEBACKS = True
    w = wl.bench_lltm(16, 32, 128, rounds=rounds, compile_modes=modes)
    return w.to_json() | {"table": wl.format_table([w])}


def peer_rows(opts, rounds: int) -> tuple[list[dict], dict]:
    """Per call of a 1024-element copy: every route, interleaved rounds; first use of the
    peers that build something (in this process: their builds are one-time)."""
    x = torch.randn(N_SMALL, device="cuda")
    routes: dict[str, Callable] = {}
    first: dict[str, float] = {}
    notes: dict[str, str] = {}
    routes["torch.clone (native op)"] = torch.clone

    ns: dict = {}
    exec(PNEX_DEFS.replace("TO_EXT", "True"), ns)  # builds the C++ launcher if this environment has none yet
    torch.testing.assert_close(ns["copy"](x), x)
    routes["pnex, to_extension=True (C++ launcher)"] = ns["copy"]
    ns_default: dict = {}
    exec(PNEX_DEFS.replace("TO_EXT", "False"), ns_default)
    routes["pnex, to_extension=False (same launcher)"] = ns_default["copy"]
    os.environ["PNEX_LAUNCHER"] = "driver"
    ns_driver: dict = {}
    exec(PNEX_DEFS.replace("TO_EXT", "False").replace("def copy(", "def copy_driver("), ns_driver)
    os.environ.pop("PNEX_LAUNCHER")
    routes["pnex, Python driver launcher (fallback)"] = ns_driver["copy_driver"]

    from numba import cuda

    @cuda.jit
    def raw_copy(a, out):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    def numba_call(a):
        out = torch.empty_like(a)
        raw_copy[(a.numel() + 255) // 256, 256](cuda.as_cuda_array(a), cuda.as_cuda_array(out))
        return out

    routes["raw numba-cuda launch"] = numba_call

    try:
        import triton
        import triton.language as tl

        @triton.jit
        def tcopy(a_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask), mask=mask)

        def triton_call(a):
            out = torch.empty_like(a)
            tcopy[(triton.cdiv(a.numel(), 256),)](a, out, a.numel(), BLOCK=256)
            return out

        t0 = time.perf_counter()
        triton_call(x)
        torch.cuda.synchronize()
        first["Triton kernel"] = time.perf_counter() - t0
        routes["Triton kernel"] = triton_call
    except ImportError:
        notes["Triton kernel"] = "triton not installed"

    if not opts.skip_old:
        try:
            import pytorch_numba_extension_jit as old

            old_ns = {"old": old, "cuda": cuda, "torch": torch}
            src = textwrap.dedent(
                """
                @old.jit(n_threads="a.numel()", to_extension=TO_EXT)
                def NAME(a: old.In(dtype="f32", shape=(None,)), result: old.Out(dtype="f32", shape="a")):
                    x = cuda.grid(1)
                    if x < a.shape[0]:
                        result[x] = a[x]
                """
            )
            for to_ext, name in ((False, "old_copy"), (True, "old_copy_ext")):
                t0 = time.perf_counter()
                exec(src.replace("TO_EXT", repr(to_ext)).replace("NAME", name), old_ns)
                old_ns[name](x)
                torch.cuda.synchronize()
                route = f"pytorch-numba-extension-jit 0.1.6, to_extension={to_ext}"
                first[route] = time.perf_counter() - t0
                routes[route] = old_ns[name]
        except Exception as exc:  # report, do not hide, a peer that failed
            notes["pytorch-numba-extension-jit 0.1.6"] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"

    hand = None
    if not opts.skip_load_inline:
        from torch.utils.cpp_extension import load_inline

        t0 = time.perf_counter()
        load_inline("pnex_bench_handwritten", cpp_sources="", cuda_sources=CUDA_SRC, is_python_module=False,
                    extra_cuda_cflags=["-O3"], verbose=False)
        route = "hand-written CUDA op (load_inline + TORCH_LIBRARY)"
        first[route] = time.perf_counter() - t0
        hand = torch.ops.handwritten
        routes[route] = hand.copy

    g = torch.cuda.CUDAGraph()
    static = torch.randn(N_SMALL, device="cuda")
    torch.clone(static)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        torch.clone(static)
    routes["CUDA graph replay of one clone"] = lambda _: g.replay()

    print(f"per call of a {N_SMALL}-element copy: {len(routes)} routes, {rounds} interleaved rounds", flush=True)
    figures = rounds_of({name: (lambda fn=fn: per_call_us(fn, x)) for name, fn in routes.items()}, rounds)
    clone_us = min(figures["torch.clone (native op)"])
    rows = [{"route": name, "us_per_call": min(runs), "rounds": runs, "vs_clone": min(runs) / clone_us,
             "first_use_s": first.get(name), "note": notes.get(name, "")} for name, runs in figures.items()]
    rows += [{"route": name, "us_per_call": None, "rounds": [], "vs_clone": None, "first_use_s": None, "note": note}
             for name, note in notes.items() if name not in figures]

    device_rows = []
    if hand is not None:
        n = (1 << 30) // 4
        a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
        for label, ours, theirs, args in (
            ("1 GiB copy", ns["copy"], hand.copy, (a,)),
            ("1 GiB a*b+c", ns["muladd"], hand.muladd, (a, b, c)),
        ):
            torch.testing.assert_close(ours(*args), theirs(*args))
            times = rounds_of({"pnex": lambda f=ours, args=args: device_seconds(f, args) * 1e3,
                               "hand": lambda f=theirs, args=args: device_seconds(f, args) * 1e3}, min(rounds, 3),
                              log=lambda _: None)
            t_ours, t_hand = min(times["pnex"]), min(times["hand"])
            moved = (len(args) + 1) * n * 4
            device_rows.append({"workload": label, "pnex_ms": t_ours, "handwritten_ms": t_hand,
                                "ratio_hand_over_pnex": t_hand / t_ours, "pnex_TBps": moved / t_ours / 1e9})
        del a, b, c
    return rows, {"device_time": device_rows}


def print_peer_rows(rows: list[dict]) -> None:
    rounds = max((len(r["rounds"]) for r in rows), default=0)
    print(f"\nper call of a {N_SMALL}-element float32 copy, µs (minimum of {rounds} rounds' medians)")
    for r in rows:
        us = f"{r['us_per_call']:8.2f}" if r["us_per_call"] is not None else "       -"
        ratio = f"{r['vs_clone']:6.3f}x" if r["vs_clone"] is not None else "       "
        first = f"  first use {r['first_use_s']:.2f} s" if r["first_use_s"] is not None else ""
        print(f"{r['route']:58s} {us} µs {ratio}{first}  {r['note']}")


def print_device_rows(rows: list[dict]) -> None:
    if rows:
        print("\ndevice time against a hand-written CUDA C++ kernel (CUDA events)")
    for d in rows:
        print(f"{d['workload']:14s} pnex {d['pnex_ms']:.3f} ms  hand-written {d['handwritten_ms']:.3f} ms  "
              f"speed vs hand-written {d['ratio_hand_over_pnex']:.3f}x  ({d['pnex_TBps']:.2f} TB/s)")


def main() -> int:
    opts = build_parser().parse_args()
    if not torch.cuda.is_available():
        print("overhead.py needs an NVIDIA GPU; nothing measured (benchmarks/first_use.py --device cpu runs "
              "the first-use rows on CPU tensors).")
        return 1
    result: dict = {**result_header("overhead", "pytorch-numba-extension-jit", "triton"), "goal": GOAL,
                    "rounds": opts.rounds, "n_elements": N_SMALL}
    signatures = signature_table(opts.rounds)
    result["signatures"] = signatures
    lltm = None
    if not opts.skip_lltm:
        print("LLTM 16/32/128 forward+backward against eager and torch.compile ...", flush=True)
        lltm = lltm_rows(opts.rounds, opts.skip_max_autotune)
        result["lltm"] = lltm
    first_rows = None
    if not opts.signatures_only and not opts.skip_first_use:
        import first_use

        print("first use, fresh processes ...", flush=True)
        notebook = not opts.no_notebook
        with contextlib.suppress(ImportError):
            import nbclient  # noqa: F401
        if notebook and "nbclient" not in sys.modules:
            print("  nbclient is not installed: no notebook rows")
            notebook = False
        first_rows = first_use.summarise(first_use.first_use_rounds("cuda", opts.rounds, notebook))
        result["first_use"] = first_rows
    peers = device_rows = None
    if not opts.signatures_only:
        peers, extra = peer_rows(opts, opts.rounds)
        device_rows = extra["device_time"]
        result["per_call"] = peers
        result["device_time"] = device_rows
    path = write_result(result, "overhead-signatures" if opts.signatures_only else "overhead")

    # the tables, last
    print_signature_table(signatures)
    if lltm is not None:
        print("\nLLTM 16/32/128 forward+backward (minimum of the rounds' medians; goal judged per round)")
        print(lltm["table"])
    if first_rows is not None:
        import first_use

        first_use.print_rows(first_rows, "cuda")
    if peers is not None:
        print_peer_rows(peers)
        print_device_rows(device_rows)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
