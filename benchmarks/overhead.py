"""Per-call overhead, first-use time and device time of pnex ops against every peer.

    python benchmarks/overhead.py                    # on a machine with an NVIDIA GPU
    python benchmarks/overhead.py --signatures-only  # only the table of signatures (a minute)

Rows, all in one run on one GPU:
  * per call (µs) of a table of signatures against the closest native op, on tiny
    tensors (host-bound): 1-D copy vs torch.clone; 2-D, two tensors and two scalars vs
    torch.addcmul; 3-D, four inputs vs torch.addcmul; 2-D, five inputs and two scalars
    (8 parameters with the output) vs torch.addcmul; an InMut in-place add vs
    Tensor.add_.  Each pair is measured alternately, three rounds; the ratio's goal is
    at most 1.10.  Also per signature: the same op called as torch.ops.pnex.<name>
    (without the op object's Python checks) and the device time of one call of each;
  * per call (µs) of a 1024-element float32 copy called in a host loop: torch.clone,
    pnex (to_extension=True and False: one C++ launcher serves both), pnex through its
    pure-Python driver launcher, pytorch-numba-extension-jit 0.1.6 (both modes, if
    installed), a raw numba-cuda launch, a Triton kernel, a hand-written CUDA op built
    with load_inline and registered with TORCH_LIBRARY, and CUDA-graph replay of one clone;
  * first use: a new pnex kernel from definition to first result, cold (empty cache) and
    warm (unchanged definition re-run in a fresh process);
  * device time (CUDA events) of a 1 GiB copy and a 1 GiB a*b+c: pnex's kernel against a
    hand-written CUDA C++ kernel with the same algorithm and launch configuration.

Prints a table and writes JSON (GPU, driver, versions, date) to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import time

import torch

from bench_common import device_seconds, result_header, write_result

N_SMALL = 1024


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


def first_use(salt: str) -> float:
    """Seconds from the start of a kernel's definition to its first result, in a fresh
    process that shares this one's cache (so the C++ launcher is already built).  A
    new ``salt`` (a comment in the kernel's source) makes it a new kernel."""
    code = textwrap.dedent(
        f"""
        import time, torch, pnex_magic as pnex
        from numba import cuda
        torch.ones(1, device="cuda"); torch.cuda.synchronize()
        t0 = time.perf_counter()

        @pnex.jit(n_threads="a.numel()", to_extension=True)
        def copy(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
            x = cuda.grid(1)  # salt {salt}
            if x < a.shape[0]:
                result[x] = a[x]

        copy(torch.ones(1024, device="cuda")); torch.cuda.synchronize()
        print(time.perf_counter() - t0)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


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


def _signature_cases(ns: dict) -> list[tuple[str, str, object, object, tuple]]:
    """(signature, native op's name, pnex op, native callable, arguments)."""
    v = lambda *shape: torch.randn(*shape, device="cuda")  # noqa: E731
    a2, b2 = v(32, 32), v(32, 32)
    a3 = [v(4, 16, 16) for _ in range(4)]
    five = [v(32, 32) for _ in range(5)]
    x, y = v(N_SMALL), v(N_SMALL)
    return [
        ("1-D copy", "torch.clone", ns["sig_copy"], torch.clone, (v(N_SMALL),)),
        ("2-D, 2 tensors + 2 scalars", "torch.addcmul(a, a, b, value=s)", ns["sig_2d_scalars"],
         lambda a, b, s, t: torch.addcmul(a, a, b, value=s), (a2, b2, 0.5, 0.25)),
        ("3-D, 4 tensors", "torch.addcmul(a, b, c)", ns["sig_3d_four"],
         lambda a, b, c, d: torch.addcmul(a, b, c), tuple(a3)),
        ("2-D, 5 tensors + 2 scalars", "torch.addcmul(a, b, c, value=s)", ns["sig_2d_eight"],
         lambda a, b, c, d, e, s, t: torch.addcmul(a, b, c, value=s), (*five, 0.5, 3)),
        ("InMut in-place add", "Tensor.add_", ns["sig_inmut"], lambda x, y: x.add_(y), (x, y)),
    ]


def per_call_args_us(fn, args, calls: int = 2000, repeats: int = 7) -> float:
    return per_call_us(lambda packed: fn(*packed), args, calls, repeats)


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


def signature_table() -> list[dict]:
    """Per-call overhead of each signature against its closest native op."""
    ns: dict = {}
    exec(SIGNATURE_DEFS, ns)
    rows = []
    for signature, native_name, op, native, args in _signature_cases(ns):
        reference = native(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        if signature.startswith("InMut"):
            check = args[0].clone()
            op(check, args[1])
            torch.testing.assert_close(check, reference)
        else:
            expected = {
                "1-D copy": lambda: args[0],
                "2-D, 2 tensors + 2 scalars": lambda: args[0] + args[2] * args[0] * args[1] + args[3],
                "3-D, 4 tensors": lambda: args[0] + args[1] * args[2] + args[3],
                "2-D, 5 tensors + 2 scalars": lambda: (args[0] * args[1] + args[2] * args[3]
                                                       + args[4] * args[5] + args[6]),
            }[signature]()
            torch.testing.assert_close(op(*args), expected)
        direct = getattr(torch.ops.pnex, op.definition.op_name).default
        pnex_runs, native_runs, direct_runs = [], [], []
        for _ in range(3):  # alternate, so drift on a shared machine hits both
            pnex_runs.append(per_call_args_us(op, args))
            native_runs.append(per_call_args_us(native, args))
            direct_runs.append(per_call_args_us(direct, args))
        pnex_us, native_us = statistics.median(pnex_runs), statistics.median(native_runs)
        row = {
            "signature": signature,
            "native": native_name,
            "params": len(op.spec.params),
            "pnex_us": pnex_us,
            "native_us": native_us,
            "ratio": pnex_us / native_us,
            "torch_ops_us": statistics.median(direct_runs),
            "pnex_device_us": device_us_per_call(op, args),
            "native_device_us": device_us_per_call(native, args),
        }
        rows.append(row)
        print(f"{signature:28s} pnex {pnex_us:6.2f} µs  {native_name:34s} {native_us:6.2f} µs  "
              f"{row['ratio']:.3f}x  (torch.ops route {row['torch_ops_us']:.2f} µs; device "
              f"{row['pnex_device_us']:.2f} vs {row['native_device_us']:.2f} µs)", flush=True)
    return rows


def print_signature_table(rows: list[dict]) -> None:
    print(f"\nper-call overhead by signature (goal: at most {GOAL:.2f}x the closest native op)")
    print(f"{'signature':28s} {'params':>6} {'pnex µs':>8} {'native µs':>9} {'ratio':>6}  {'torch.ops µs':>12}  native op")
    for r in rows:
        flag = "" if r["ratio"] <= GOAL else "  (over the goal)"
        print(f"{r['signature']:28s} {r['params']:>6} {r['pnex_us']:8.2f} {r['native_us']:9.2f} {r['ratio']:6.3f}  "
              f"{r['torch_ops_us']:12.2f}  {r['native']}{flag}")


GOAL = 1.10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-old", action="store_true", help="skip pytorch-numba-extension-jit")
    parser.add_argument("--skip-load-inline", action="store_true", help="skip the hand-written CUDA op")
    parser.add_argument("--signatures-only", action="store_true", help="only the table of signatures")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        print("overhead.py needs an NVIDIA GPU; nothing measured.")
        return 1
    signatures = signature_table()
    if opts.signatures_only:
        path = write_result({**result_header("overhead-signatures"), "goal": GOAL, "signatures": signatures},
                            "overhead-signatures")
        print_signature_table(signatures)
        print(f"wrote {path}")
        return 0
    rows: list[dict] = []

    def row(route, us=None, first_use_s=None, note=""):
        rows.append({"route": route, "us_per_call": us, "first_use_s": first_use_s, "note": note})
        u = f"{us:8.2f}" if us is not None else "       -"
        f = f"{first_use_s:8.2f}" if first_use_s is not None else "       -"
        print(f"{route:58s} {u} µs  first use {f} s  {note}", flush=True)

    x = torch.randn(N_SMALL, device="cuda")
    clone_us = per_call_us(torch.clone, x)
    row("torch.clone (native op)", clone_us)

    # pnex in this process (builds the C++ launcher if this environment has none yet),
    # then a new kernel's first use (cold) and an unchanged re-run (warm) in fresh processes
    ns: dict = {}
    t0 = time.perf_counter()
    exec(PNEX_DEFS.replace("TO_EXT", "True"), ns)
    define_s = time.perf_counter() - t0
    salt = str(time.time_ns())
    cold = first_use(salt)
    warm = first_use(salt)
    pnex_copy = ns["copy"]
    torch.testing.assert_close(pnex_copy(x), x)
    ext_us = per_call_us(pnex_copy, x)
    row("pnex, to_extension=True (C++ launcher)", ext_us, cold, f"warm re-run {warm:.2f} s")
    ns_default: dict = {}
    exec(PNEX_DEFS.replace("TO_EXT", "False"), ns_default)
    row("pnex, to_extension=False (same launcher)", per_call_us(ns_default["copy"], x))
    os.environ["PNEX_LAUNCHER"] = "driver"
    ns_driver: dict = {}
    exec(PNEX_DEFS.replace("TO_EXT", "False").replace("def copy(", "def copy_driver("), ns_driver)
    os.environ.pop("PNEX_LAUNCHER")
    row("pnex, Python driver launcher (fallback)", per_call_us(ns_driver["copy_driver"], x))

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

    row("raw numba-cuda launch", per_call_us(numba_call, x))

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
        row("Triton kernel", per_call_us(triton_call, x), time.perf_counter() - t0)
    except ImportError:
        row("Triton kernel", note="triton not installed")

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
                first = time.perf_counter() - t0
                row(f"pytorch-numba-extension-jit 0.1.6, to_extension={to_ext}", per_call_us(old_ns[name], x), first)
        except Exception as exc:  # report, do not hide, a peer that failed
            row("pytorch-numba-extension-jit 0.1.6", note=f"failed: {type(exc).__name__}: {str(exc)[:120]}")

    hand = None
    if not opts.skip_load_inline:
        from torch.utils.cpp_extension import load_inline

        t0 = time.perf_counter()
        load_inline("pnex_bench_handwritten", cpp_sources="", cuda_sources=CUDA_SRC, is_python_module=False,
                    extra_cuda_cflags=["-O3"], verbose=False)
        build_s = time.perf_counter() - t0
        hand = torch.ops.handwritten
        row("hand-written CUDA op (load_inline + TORCH_LIBRARY)", per_call_us(hand.copy, x), build_s)

    g = torch.cuda.CUDAGraph()
    static = torch.randn(N_SMALL, device="cuda")
    torch.clone(static)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        torch.clone(static)
    row("CUDA graph replay of one clone", per_call_us(lambda _: g.replay(), None))

    # device time, 1 GiB
    device_rows = []
    if hand is not None:
        n = (1 << 30) // 4
        a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
        for label, ours, theirs, args in (
            ("1 GiB copy", pnex_copy, hand.copy, (a,)),
            ("1 GiB a*b+c", ns["muladd"], hand.muladd, (a, b, c)),
        ):
            torch.testing.assert_close(ours(*args), theirs(*args))
            t_ours, t_hand = device_seconds(ours, args) * 1e3, device_seconds(theirs, args) * 1e3
            moved = (len(args) + 1) * n * 4
            device_rows.append({
                "workload": label, "pnex_ms": t_ours, "handwritten_ms": t_hand, "ratio_hand_over_pnex": t_hand / t_ours,
                "pnex_TBps": moved / t_ours / 1e9,
            })
            print(f"{label:14s} pnex {t_ours:.3f} ms  hand-written {t_hand:.3f} ms  "
                  f"speed vs hand-written {t_hand / t_ours:.3f}x  ({moved / t_ours / 1e9:.2f} TB/s)", flush=True)

    result = {
        **result_header("overhead", "pytorch-numba-extension-jit", "triton"),
        "n_elements": N_SMALL,
        "per_call": rows,
        "pnex_over_clone": ext_us / clone_us,
        "pnex_first_definition_s_including_launcher_build_if_any": define_s,
        "pnex_first_use_cold_s": cold,
        "pnex_first_use_warm_s": warm,
        "device_time": device_rows,
        "goal": GOAL,
        "signatures": signatures,
    }
    path = write_result(result, "overhead")
    print(f"\npnex / torch.clone per call: {ext_us / clone_us:.3f}x")
    print_signature_table(signatures)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
