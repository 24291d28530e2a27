"""The sizes, the sections and the goals of ``benchmarks/jax_overhead.py``: pure Python, read
before ``--help`` answers."""

from __future__ import annotations


N_SMALL = 1024
N_LARGE = (1 << 30) // 4  # 1 GiB of float32 per array
N_DONATE = (1 << 28) // 4  # 256 MiB
COEFF = 0.25
SECTIONS = ("diffusion", "stencil_hlo", "muladd_1gib", "donation", "per_call", "first_use", "command_buffers")

GOALS = {
    "diffusion": "pnex in JAX per step <= the PyTorch op's and <= jax.numpy's",
    "stencil_hlo": "no copy of the InMut buffer in the while body (pair loop)",
    "muladd_1gib": "JAX <= 1.03x the PyTorch op, <= XLA's fused a*b+c",
    "per_call": "pipelined <= 1.1x jit(x + 1), synced <= 1.05x",
    "first_use": "new kernel <= 1.0 s, unchanged <= 0.4 s",
}
