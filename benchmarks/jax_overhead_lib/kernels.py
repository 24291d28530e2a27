"""The kernels ``benchmarks/jax_overhead.py`` times (``KERNELS``, defined the way a user's cell
defines them) and the jitted diffusion loops its sections time and inspect."""

from __future__ import annotations

import textwrap

from jax_overhead_lib.settings import COEFF


# ---------------------------------------------------------------------------- kernels

KERNELS = textwrap.dedent(
    """
    import pnex_magic as pnex
    from numba import cuda, float32

    @pnex.jit(n_threads="x.numel()")
    def add_one(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] + 1

    # Bandwidth-bound, written to reach the memory's limit: 16-byte vector loads and
    # stores (pnex.vload / pnex.vstore, four floats each, as XLA's own fused kernel reads),
    # GROUPS of them per thread; GROUPS and the block chosen by the autotuner (an eager
    # call tunes; a trace uses the stored choice).
    @pnex.jit(n_threads="(a.numel() + 4 * GROUPS - 1) // (4 * GROUPS)", threads_per_block="auto")
    def muladd(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"),
               result: pnex.Out("f32", "a"), GROUPS: pnex.Tune(1, 2)):
        n = a.shape[0]
        base = (cuda.blockIdx.x * cuda.blockDim.x * GROUPS + cuda.threadIdx.x) * 4
        for g in range(GROUPS):
            i = base + g * cuda.blockDim.x * 4
            if i + 4 <= n:
                x = pnex.vload(a, i, 4)
                y = pnex.vload(b, i, 4)
                z = pnex.vload(c, i, 4)
                pnex.vstore(result, i, (x[0] * y[0] + z[0], x[1] * y[1] + z[1], x[2] * y[2] + z[2],
                                        x[3] * y[3] + z[3]))
            else:
                for j in range(i, min(i + 4, n)):
                    result[j] = a[j] * b[j] + c[j]

    @pnex.jit(n_threads="a.numel()")
    def muladd_into(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), c: pnex.InMut("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            c[i] = a[i] * b[i] + c[i]

    @pnex.jit(n_threads="x.numel()")
    def axpy_into(x: pnex.In("f32", (None,)), y: pnex.InMut("f32", "x"), s: float):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = y[i] + s * x[i]

    # A plain 5-point stencil with an Out(init=0.0): the border stays 0, the interior
    # moves by coeff times its Laplacian (the kernel writes the interior only).
    @pnex.jit(n_threads=("u.size(1)", "u.size(0)"), threads_per_block=(32, 8))
    def stencil_init(u: pnex.In("f32", (None, None)), coeff: pnex.Scalar("f32"),
                     u_new: pnex.Out("f32", "u", init=0.0)):
        x, y = cuda.grid(2)
        if 0 < y < u.shape[0] - 1 and 0 < x < u.shape[1] - 1:
            c = u[y, x]
            u_new[y, x] = c + coeff * (u[y - 1, x] + u[y + 1, x] + u[y, x - 1] + u[y, x + 1] - 4 * c)
    """
)


def diffusion_loops(step, jnp, jax, steps: int) -> dict:
    """The jitted loops the diffusion and HLO sections time and inspect."""

    def pair(u0):  # the notebook's loop: two steps per iteration, each buffer back in its slot
        def body(i, carry):
            u, scratch = carry
            scratch = step(u, scratch, COEFF)
            return step(scratch, u, COEFF), scratch

        u, scratch = jax.lax.fori_loop(0, steps // 2, body, (u0, jnp.zeros_like(u0)))
        return step(u, scratch, COEFF) if steps % 2 else u

    def pair_unrolled(u0):  # the same, 8 iterations per trip of XLA's while loop (fewer loop-condition checks)
        def body(i, carry):
            u, scratch = carry
            scratch = step(u, scratch, COEFF)
            return step(scratch, u, COEFF), scratch

        u, scratch = jax.lax.fori_loop(0, steps // 2, body, (u0, jnp.zeros_like(u0)), unroll=8)
        return step(u, scratch, COEFF) if steps % 2 else u

    def swapped(u0):  # the old notebook loop: the carry swaps its buffers every step
        def body(i, carry):
            u, scratch = carry
            return step(u, scratch, COEFF), u

        return jax.lax.fori_loop(0, steps, body, (u0, jnp.zeros_like(u0)))[0]

    def jnp_stencil(u0):
        def body(i, u):
            p = jnp.pad(u, 1)
            return u + COEFF * (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u)

        return jax.lax.fori_loop(0, steps, body, u0)

    return {
        "pnex in JAX, pair carry (notebook 06)": jax.jit(pair),
        "pnex in JAX, pair carry, u0 donated": jax.jit(pair, donate_argnums=0),
        "pnex in JAX, pair carry, fori_loop(unroll=8)": jax.jit(pair_unrolled),
        "pnex in JAX, swapped carry (old notebook)": jax.jit(swapped),
        "jax.numpy stencil (XLA fuses it)": jax.jit(jnp_stencil),
    }
