"""pnex kernels in JAX on a GPU at native speed (issue 17): what XLA compiles and what
the handler launches.  Every test is marked ``gpu`` and needs JAX's CUDA backend.

* The notebook's diffusion loop (the ping-pong pair kept in its slots) compiles to a
  while loop with no copy of the InMut buffer in its body and no conditional, and
  matches the PyTorch op; with command buffers on, too.
* A traced autotuned op launches the block the PyTorch op's tuner stored; an eager
  call on a key not tuned yet tunes it through the PyTorch op (the InMut array is
  left as it was).
* Out(init=...) is filled by the handler's memsets, bit for bit as ``torch.full``.
* A kernel the PyTorch op compiled is not compiled again for JAX; the handler loads
  the kernel when XLA builds the executable.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU in one process

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import pnex_magic as pnex  # noqa: E402
from pnex_magic.launch import autotune, xla  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import jax_overhead  # noqa: E402
import workloads  # noqa: E402


def _jax_gpus():
    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _jax_gpus(), reason="JAX has no CUDA backend here")]

N = 512  # the diffusion field's side


@pytest.fixture(scope="module")
def field():
    return workloads.initial_field(N)


def test_the_notebook_loop_keeps_the_inmut_buffer_in_place(field):
    step = pnex.jax_op(workloads.diffusion_step)
    loops = jax_overhead.diffusion_loops(step, jnp, jax, 100)
    u0 = jnp.asarray(field.numpy())
    text = loops["pnex in JAX, pair carry (notebook 06)"].lower(u0).compile().as_text()
    counts = jax_overhead.hlo_counts(text, f"f32[{N},{N}]")
    assert counts["copies_in_while_body"] == 0, text
    assert counts["conditionals"] == 0 and counts["custom_calls"] == 2
    donated = loops["pnex in JAX, pair carry, u0 donated"].lower(u0).compile().as_text()
    assert jax_overhead.hlo_counts(donated, f"f32[{N},{N}]")["copies_in_while_body"] == 0


@pytest.mark.parametrize("steps", [50, 51])  # an odd count ends with one more step after the loop
def test_the_notebook_loop_matches_the_pytorch_op(field, steps):
    step = pnex.jax_op(workloads.diffusion_step)
    loop = jax_overhead.diffusion_loops(step, jnp, jax, steps)["pnex in JAX, pair carry (notebook 06)"]
    got = np.asarray(loop(jnp.asarray(field.numpy())))
    expected = workloads.run_diffusion(workloads.diffusion_step, field.cuda(), steps, 0.25).cpu().numpy()
    np.testing.assert_array_equal(got, expected)  # the same kernel, block and order of operations
    reference = workloads.reference_diffusion(field, steps, 0.25).numpy()
    assert np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max()


def test_the_loop_under_command_buffers_matches(field, pnex_env, tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT / "benchmarks")!r})
        import jax, jax.numpy as jnp, numpy as np
        import pnex_magic as pnex, workloads, jax_overhead
        step = pnex.jax_op(workloads.diffusion_step)
        loop = jax_overhead.diffusion_loops(step, jnp, jax, 40)["pnex in JAX, pair carry (notebook 06)"]
        np.save({str(tmp_path / "u.npy")!r}, np.asarray(loop(jnp.asarray(workloads.initial_field({N}).numpy()))))
        """
    )
    env = {**pnex_env, "XLA_FLAGS": "--xla_gpu_enable_command_buffer=+WHILE,+CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = workloads.run_diffusion(workloads.diffusion_step, field.cuda(), 40, 0.25).cpu().numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "u.npy"), expected)


def test_a_donated_inmut_argument_is_not_copied():
    @pnex.jit(n_threads="x.numel()")
    def axpy_into(x: pnex.In("f32", (None,)), y: pnex.InMut("f32", "x"), s: float):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = y[i] + s * x[i]

    f = pnex.jax_op(axpy_into)
    x, y = jnp.ones(1 << 20), jnp.full(1 << 20, 2.0)
    kept = jax.jit(lambda x, y: f(x, y, 0.5)).lower(x, y).compile().as_text()
    donated = jax.jit(lambda x, y: f(x, y, 0.5), donate_argnums=1).lower(x, y).compile().as_text()
    assert jax_overhead.hlo_counts(kept)["copies_elsewhere"] == 1  # y, which the caller keeps
    assert jax_overhead.hlo_counts(donated)["copies_elsewhere"] == 0
    out = jax.jit(lambda x, y: f(x, y, 0.5), donate_argnums=1)(x, jnp.array(y))
    np.testing.assert_array_equal(out, np.full(1 << 20, 2.5, np.float32))
    np.testing.assert_array_equal(y, np.full(1 << 20, 2.0, np.float32))


# ------------------------------------------------------------------------------- autotuned blocks


def _tuned_kernel():
    @pnex.jit(n_threads="x.numel()", threads_per_block=[64, 256, 1024])
    def tuned_axpy(x: pnex.In("f32", (None,)), y: pnex.InMut("f32", "x"), s: float):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = y[i] + s * x[i]

    return tuned_axpy


def _launched_block(jitted, *args) -> tuple[int, ...]:
    text = jitted.lower(*args).as_text()
    (line,) = [line for line in text.splitlines() if f"@{xla.TARGET}(" in line]
    start = line.index("block = dense<[") + len("block = dense<[")
    return tuple(int(v) for v in line[start:line.index("]", start)].split(","))


def test_a_traced_autotuned_op_launches_the_stored_block(fresh_cache):
    op = _tuned_kernel()
    n = 3 << 20
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    op(x, y.clone(), 2.0)  # the PyTorch op tunes this key
    chosen = autotune.result_for(op.definition, (x, y, 2.0))
    assert chosen is not None and chosen.timed
    f = jax.jit(pnex.jax_op(op), static_argnums=2)
    jx, jy = jnp.asarray(x.cpu().numpy()), jnp.asarray(y.cpu().numpy())
    assert _launched_block(f, jx, jy, 2.0) == (*chosen.block, 1, 1)[:3]
    np.testing.assert_allclose(f(jx, jy, 2.0), jy + 2.0 * jx, rtol=1e-6, atol=1e-6)


def test_an_eager_call_tunes_through_the_pytorch_op_first(fresh_cache):
    op = _tuned_kernel()
    f = pnex.jax_op(op)
    n = 5 << 20
    x = jax.random.normal(jax.random.key(0), (n,), jnp.float32)
    y = jax.random.normal(jax.random.key(1), (n,), jnp.float32)
    y_before = np.asarray(y)
    autotune.stats.reset()
    out = f(x, y, 0.5)
    assert autotune.stats.benchmarks == 1  # timed once, by the PyTorch op on DLPack views
    np.testing.assert_array_equal(np.asarray(y), y_before)  # the tuner ran on a copy of the InMut array
    np.testing.assert_allclose(out, y_before + 0.5 * np.asarray(x), rtol=1e-6, atol=1e-6)
    f(x, y, 0.5)
    assert autotune.stats.benchmarks == 1  # the choice is kept
    meta = torch.empty(n, device="meta")
    key = autotune.key_values(op.spec, {"x": meta, "y": meta, "s": 0.5})
    chosen = autotune.stored_choice(op.definition, device_index=0, layout="C", key=key)
    assert chosen is not None
    assert _launched_block(jax.jit(f, static_argnums=2), x, y, 0.5) == (*chosen.block, 1, 1)[:3]


# ------------------------------------------------------------------------------- Out(init=...)


def test_out_init_is_filled_bit_for_bit(x64):
    @pnex.jit(n_threads="a.numel()", threads_per_block=64)
    def fills(
        a: pnex.In("f32", (None,)),
        zero: pnex.Out("f32", "a", init=0.0),
        negative_zero: pnex.Out("f32", "a", init=-0.0),
        nan: pnex.Out("f32", "a", init=float("nan")),
        half: pnex.Out("f16", "a", init=1.5),
        brain: pnex.Out("bf16", "a", init=-2.0),
        byte: pnex.Out("i8", "a", init=-1),
        flag: pnex.Out("bool", "a", init=True),
        wide: pnex.Out("i64", "a", init=2**32 + 1),
        odd: pnex.Out("f64", "a", init=1.5),  # no memset pattern: XLA fills it
    ):
        i = cuda.grid(1)
        if i == 0 and a.shape[0] > 0:
            zero[0] = a[0]

    f = jax.jit(pnex.jax_op(fills))
    a = jnp.arange(1000, dtype=jnp.float32) + 7
    results = f(a)
    for p, got in zip(fills.spec.outputs, results):
        expected = torch.full((1000,), p.init, dtype=p.dtype.torch)
        if p.name == "zero":
            expected[0] = 7.0
        got_bits = np.asarray(got).view(np.uint8)
        assert got_bits.tobytes() == expected.view(torch.uint8).numpy().tobytes(), p.name


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


# ------------------------------------------------------------------------------- first use


def test_jax_reuses_the_kernel_the_pytorch_op_compiled():
    @pnex.jit(n_threads="x.numel()")
    def plus_two(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] + 2

    assert float(plus_two(torch.ones(8, device="cuda"))[0]) == 3.0
    variants = len(plus_two.definition._compiled)
    compiled = jax.jit(pnex.jax_op(plus_two)).lower(jnp.ones(8)).compile()
    assert len(plus_two.definition._compiled) == variants  # nothing compiled again
    lib = xla.load_library()
    assert lib.pnex_jax_loaded(xla.kernel_id(plus_two.definition)) >= 1  # loaded when XLA built the executable
    np.testing.assert_array_equal(compiled(jnp.ones(8)), np.full(8, 3.0, np.float32))


def test_a_kernel_reading_a_device_array_global_is_refused_on_a_jax_gpu():
    """A device array read as a global is a hidden argument of the PyTorch op's launches
    (issue 26); XLA launches with its own buffers only, so JAX on a GPU refuses the
    kernel clearly (on CPU, JAX runs it through the simulator: tests/test_globals.py)."""
    table = torch.randn(4, device="cuda")

    @pnex.jit(n_threads="a.numel()")
    def adds_table_global(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + table[i % 4]

    f = pnex.jax_op(adds_table_global)
    with pytest.raises(pnex.KernelDefinitionError, match=r"reads the device array\(s\) 'table' as globals.*JAX "
                                                         r"computation on a GPU"):
        f(jnp.ones(8, dtype=jnp.float32, device=_jax_gpus()[0]))
