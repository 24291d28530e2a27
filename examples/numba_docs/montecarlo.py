"""Monte Carlo integration with Numba's xoroshiro128+ generators: numba-cuda's
``doc_examples/test_montecarlo.py``, ported to pnex.

The kernel's body is the documentation's, calling ``xoroshiro128p_uniform_float32`` on
the generator states and the docs' ``func``, a ``@numba.jit`` function.  The states are
``InMut("xoroshiro128p", "out")``: a ``(n, 2)`` uint64 tensor that the kernel sees as
Numba's array of ``xoroshiro128p_dtype`` records, made by
``pnex.xoroshiro128p_states(nsamps, seed)`` where the docs call
``create_xoroshiro128p_states(nsamps, seed=42)`` (the same streams).  ``out`` is the docs'
zero-filled device array, written in place; the docs launch
``mc_integrator_kernel.forall(nsamps)`` and sum ``out`` with a ``@cuda.reduce`` function,
which the port does with ``torch.sum``.  The docs' limits are Python ints (Numba types
them int64, so a sample is scaled in float64), hence ``int`` annotations.

The reference replays Numba's generator in NumPy from the states Numba's own
initialiser makes, so the samples, ``out`` and the integral are compared one for one
(float32 values within one rounding, the float32 sum of ``out`` within 1e-5), and the
states the kernel leaves are compared exactly.
"""

from __future__ import annotations

import numpy as np
import torch

import pnex_magic as pnex

TITLE = "Monte Carlo integration with Numba's xoroshiro128p generators"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_montecarlo.py: test_ex_montecarlo, mc_integrator_kernel"
GPU_ONLY = False
# float32 samples and 1/x: one rounding apart at most; the integral is a float32 sum of 10^6 terms.
TOLERANCE = dict(rtol=1e-5, atol=0.0)


def define():
    import numba
    from numba import cuda
    from numba.cuda.random import xoroshiro128p_uniform_float32

    # define a function to integrate
    @numba.jit
    def func(x):
        return 1.0 / x

    @pnex.jit(n_threads="len(out)")
    def mc_integrator_kernel(out: pnex.InMut("f32", (None,)), rng_states: pnex.InMut("xoroshiro128p", "out"),
                             lower_lim: int, upper_lim: int):
        """
        kernel to draw random samples and evaluate the function to
        be integrated at those sample values
        """
        size = len(out)

        gid = cuda.grid(1)
        if gid < size:
            # draw a sample between 0 and 1 on this thread
            samp = xoroshiro128p_uniform_float32(rng_states, gid)

            # normalize this sample to the limit range
            samp = samp * (upper_lim - lower_lim) + lower_lim

            # evaluate the function to be
            # integrated at the normalized
            # value of the sample
            y = func(samp)
            out[gid] = y

    return mc_integrator_kernel


def mc_integrate(kernel, lower_lim: int, upper_lim: int, nsamps: int, seed: int, device: str):
    """The docs' ``mc_integrate``: ``out``, the states, the launch, the sum times the factor."""
    out = torch.zeros(nsamps, dtype=torch.float32, device=device)
    rng_states = pnex.xoroshiro128p_states(nsamps, seed=seed, device=device)
    kernel(out, rng_states, lower_lim, upper_lim)
    # normalization factor to convert
    # to the average: (b - a)/(N - 1)
    factor = (upper_lim - lower_lim) / (nsamps - 1)
    return out.sum() * factor, out, rng_states


def reference(lower_lim: int, upper_lim: int, nsamps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``out`` and the states after one draw each: Numba's initialiser for the states, its
    xoroshiro128+ step and float32 conversion replayed in NumPy."""
    from numba.cuda.random import init_xoroshiro128p_states_cpu, xoroshiro128p_dtype

    states = np.empty(nsamps, dtype=xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, seed, 0)
    words = states.view(np.uint64).reshape(nsamps, 2)
    s0, s1 = words[:, 0].copy(), words[:, 1].copy()
    result = s0 + s1  # uint64 arrays wrap silently
    s1 ^= s0
    after = np.stack([((s0 << np.uint64(55)) | (s0 >> np.uint64(9))) ^ s1 ^ (s1 << np.uint64(14)),
                      (s1 << np.uint64(36)) | (s1 >> np.uint64(28))], 1)
    samples = ((result >> np.uint64(11)).astype(np.float64) * 2.0**-53).astype(np.float32)
    out = (1.0 / (samples.astype(np.float64) * (upper_lim - lower_lim) + lower_lim)).astype(np.float32)
    return out, after


def _halves(words: torch.Tensor) -> torch.Tensor:
    """64-bit words as their 32-bit halves: exact in the float64 the harness compares in."""
    return torch.stack([words & 0xFFFFFFFF, (words >> 32) & 0xFFFFFFFF], -1)


def _nsamps(device: str) -> int:
    return 1_000_000 if device != "cpu" else 512  # the docs' number of samples on a GPU


def run(device: str, seed: int) -> tuple[dict, dict]:
    kernel = define()
    nsamps = _nsamps(device)
    results, references = {}, {}
    for lower, upper in ((1, 2), (2, 3)):  # the docs' two integrals
        integral, out, states = mc_integrate(kernel, lower, upper, nsamps, seed, device)
        ref_out, ref_states = reference(lower, upper, nsamps, seed)
        key = f"{lower}_{upper}"
        results.update({f"integral_{key}": integral.reshape(1), f"out_{key}": out,
                        f"states_{key}": _halves(states.view(torch.int64))})
        references.update({
            f"integral_{key}": torch.tensor([ref_out.astype(np.float64).sum() * (upper - lower) / (nsamps - 1)]),
            f"out_{key}": torch.from_numpy(ref_out),
            f"states_{key}": _halves(torch.from_numpy(ref_states.view(np.int64))),
        })
    return results, references


def timed(device: str):
    kernel = define()
    nsamps = _nsamps(device)
    out = torch.zeros(nsamps, dtype=torch.float32, device=device)
    states = pnex.xoroshiro128p_states(nsamps, seed=42, device=device)
    return (lambda: kernel(out, states, 1, 2)), (lambda: 1.0 / (torch.rand(nsamps, device=device) + 1.0))
