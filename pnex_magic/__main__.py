"""``python -m pnex_magic``: a demo that compiles a kernel, prints its report and
runs it (on the GPU if there is one, else on CPU tensors through the simulator),
checking the result against PyTorch."""

from __future__ import annotations

import sys
import time

import torch
from numba import cuda

import pnex_magic as pnex


@pnex.jit(n_threads=("result.size(1)", "result.size(0)"))
def muladd(
    a: pnex.In("f32", (None, None)),
    b: pnex.In("f32", "a"),
    c: float,
    result: pnex.Out("f32", "a"),
):
    x, y = cuda.grid(2)
    if y < result.shape[0] and x < result.shape[1]:
        result[y, x] = a[y, x] * b[y, x] + c


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(pnex.inspect(muladd))
    shape = (1024, 1024) if device == "cuda" else (48, 40)
    a = torch.randn(shape, device=device)
    b = torch.randn(shape, device=device)
    start = time.perf_counter()
    out = muladd(a, b, 0.5)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    ref = a.double() * b.double() + 0.5
    err = ((out.double() - ref).norm() / ref.norm()).item()
    where = "GPU" if device == "cuda" else "CPU tensors, numba-cuda's CUDA simulator"
    print(f"\nran muladd on {tuple(shape)} ({where}) in {elapsed * 1e3:.1f} ms; relative error vs torch: {err:.2e}")
    compiled = torch.compile(lambda a, b: muladd(a, b, 0.5) * 2, fullgraph=True)
    err2 = ((compiled(a, b).double() - 2 * ref).norm() / ref.norm()).item()
    print(f"torch.compile(fullgraph=True) through the op: relative error {err2:.2e}")
    ok = err < 1e-6 and err2 < 1e-6
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
