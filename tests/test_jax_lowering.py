"""What XLA gets from a pnex kernel in JAX, checked without a GPU (issue 17).

* The ``pnex_launch`` primitive lowers per platform: the CUDA lowering is one custom
  call and no ``case`` on the platform, the CPU lowering one host callback.
* Only ``InMut`` results alias operands; an ``Out(init=...)`` becomes a memset pattern
  the handler fills (:func:`pnex_magic.launch.xla.fill_pattern`), or, where no
  pattern expresses the value, a buffer XLA fills.
* The stateful FFI handler runs its instantiate stage when XLA builds the executable:
  checked by registering it for the CPU platform too and compiling the CUDA lowering
  with XLA's CPU compiler (in a subprocess: that registration and lowering rule must
  not leak into other tests).  The same compiles count the copies XLA inserts into
  a ``fori_loop`` of the 5-point stencil: none in the loop body when the ping-pong
  pair keeps its slots (copy insertion is the same pass on the GPU; the GPU tests
  check the GPU's HLO).
* A jitted function's trace launches the block the PyTorch op's tuner stored for
  its key (here with the stored choice and the GPU stubbed).
* A built handler library is found again without importing ``torch.utils.cpp_extension``.
* First use through the GPU's lowering: a new kernel is compiled once (when defined; JAX
  registers that code), the unchanged kernel in a fresh process is a cache hit that runs no
  Numba compile, and a kernel the PyTorch op already ran is not compiled again.
"""

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import pnex_magic as pnex  # noqa: E402
from pnex_magic.frontends import jax as jax_frontend  # noqa: E402
from pnex_magic.launch import autotune, build, xla  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
needs_headers = pytest.mark.skipif(build.cuda_include_dir() is None, reason="no CUDA headers (cuda.h) here")


def randn(*shape, dtype=np.float32):
    return jnp.asarray(np.random.default_rng().standard_normal(shape).astype(dtype))


def cuda_module_text(fn, *args, platforms=("cuda",)):
    exported = jax.export.export(
        jax.jit(fn), platforms=list(platforms),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(xla.TARGET)],
    )(*args)
    return exported.mlir_module()


@pnex.jit(n_threads="a.numel()", threads_per_block=32)
def fills(
    a: pnex.In("f64", (None,)),
    zeros: pnex.Out("f64", "a", init=0),
    halves: pnex.Out("f64", "a", init=1.5),
    flags: pnex.Out("bool", "a", init=True),
):
    i = cuda.grid(1)
    if i < a.shape[0] and i == 0:
        zeros[i] = a[i]
        halves[i] = a[i]
        flags[i] = False


@pnex.jit(n_threads="x.numel()", threads_per_block=[64, 128, 32])
def tuned_scale(x: pnex.In("f32", (None,)), s: float, y: pnex.Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * s


# ------------------------------------------------------------------------------- fills


@pytest.mark.parametrize(
    "dtype, value, expected",
    [
        (torch.float32, 0.0, (1, 0)),
        (torch.float32, -0.0, (4, 0x80000000)),  # the sign bit, not zero
        (torch.float32, 1.5, (4, 0x3FC00000)),
        (torch.float32, float("nan"), (4, 0x7FC00000)),
        (torch.float16, 1.0, (2, 0x3C00)),
        (torch.bfloat16, -2.0, (2, 0xC000)),
        (torch.int8, -1, (1, 0xFF)),
        (torch.int32, 7, (4, 7)),
        (torch.bool, True, (1, 1)),
        (torch.float64, 0.0, (1, 0)),
        (torch.int64, -1, (1, 0xFF)),
        (torch.int64, 2**32 + 1, (4, 1)),  # both 32-bit halves are 1
        (torch.float64, 1.5, None),  # halves 0x3FF80000 and 0: XLA fills it
        (torch.int64, 5, None),
    ],
)
def test_fill_pattern(dtype, value, expected):
    assert xla.fill_pattern(dtype, value) == expected
    if expected is not None:  # the pattern repeated is the value's bits
        width, pattern = expected
        itemsize = torch.empty((), dtype=dtype).element_size()
        raw = pattern.to_bytes(width, "little") * (itemsize // width)
        assert raw == torch.tensor([value], dtype=dtype).view(torch.uint8).numpy().tobytes()


def test_out_init_without_a_memset_pattern_is_filled_by_xla(x64):
    layout = xla.call_layout(fills.spec)
    assert layout.operands == ("a", "halves") and layout.results == ("zeros", "halves", "flags")
    assert dict(layout.aliases) == {1: 1} and layout.fills == (1, 0, 0, 0, 1, 1)
    f = pnex.jax_op(fills)
    a = randn(6, dtype=np.float64)
    text = cuda_module_text(f, a)
    (call,) = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert "output_tuple_indices = [1], operand_index = 1," in call and call.count("output_operand_alias<") == 1
    zeros, halves, flags = jax.jit(f)(a)
    np.testing.assert_array_equal(zeros, np.r_[a[0], np.zeros(5)])
    np.testing.assert_array_equal(halves, np.r_[a[0], np.full(5, 1.5)])
    np.testing.assert_array_equal(flags, [False] + [True] * 5)


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


# ------------------------------------------------------------------------------- lowering


def test_one_function_lowers_for_cpu_and_cuda_without_a_platform_switch():
    f = pnex.jax_op(tuned_scale)
    x = randn(100)
    cpu = jax.jit(lambda x: f(x, 2.0)).lower(x)
    assert "stablehlo.case" not in cpu.as_text() and "conditional" not in cpu.compile().as_text()
    cuda_only = cuda_module_text(lambda x: f(x, 2.0), x)
    assert "stablehlo.case" not in cuda_only and xla.TARGET in cuda_only
    both = jax.jit(lambda x: f(x, 2.0)).trace(x).lower(lowering_platforms=("cpu", "cuda")).as_text()
    assert xla.TARGET in both and "callback" in both  # lowered for both, it switches on the platform


def test_a_launch_outside_any_trace_runs():
    f = pnex.jax_op(tuned_scale)
    x = randn(50)
    with jax.disable_jit():
        np.testing.assert_allclose(f(x, 3.0), 3 * x, rtol=1e-6)


def test_vmap_of_the_primitive_inside_jit_and_grad_of_nothing_else():
    f = pnex.jax_op(tuned_scale)
    xs = randn(3, 40)
    out = jax.jit(jax.vmap(lambda x: f(x, 0.5), in_axes=1, out_axes=1))(xs.T.copy().T)
    np.testing.assert_allclose(out, 0.5 * xs, rtol=1e-6)


# ------------------------------------------------------------------------------- block shapes


def test_a_trace_launches_the_stored_autotune_choice(monkeypatch, caplog):
    f = pnex.jax_op(tuned_scale)
    x = randn(1000)

    class Gpu:  # what the trace asks of the GPU JAX would run on
        id = local_hardware_id = 0
        compute_capability = "9.0"

    asked = []

    def stored_choice(definition, *, device_index, layout, key):
        asked.append((device_index, layout, key))
        candidates = definition.spec.block_candidates
        return autotune.TuneResult("tuned_scale", key, "", tuple(autotune.CandidateResult(b) for b in candidates), 1,
                                   "disk cache")

    monkeypatch.setattr(jax_frontend, "_cuda_devices", lambda: (Gpu(),))
    monkeypatch.setattr(autotune, "stored_choice", stored_choice)
    monkeypatch.setattr(jax_frontend, "_kernel_id", lambda definition, variant=0: 1)
    text = cuda_module_text(lambda x: f(x, 2.0), x)
    assert asked == [(0, "C", autotune.key_values(tuned_scale.spec, {"x": torch.empty(1000, device="meta"), "s": 2.0}))]
    assert "block = dense<[128, 1, 1]>" in text and "grid = dense<[8, 1, 1]>" in text  # the stored choice, 128

    monkeypatch.setattr(autotune, "stored_choice", lambda *a, **k: None)
    jax_frontend._WARNED.discard("tuned_scale")
    with caplog.at_level("WARNING", logger="pnex_magic.frontends.jax"):
        text = cuda_module_text(lambda x: f(x, 3.0), x)
    assert "block = dense<[64, 1, 1]>" in text  # the first candidate
    assert "no block was chosen yet" in caplog.text and "Call the JAX function once on concrete arrays" in caplog.text


@pnex.jit(n_threads="x.numel()", threads_per_block=[64, 128])
def tuned_axpy(x: pnex.In("f32", (None,)), y: pnex.InMut("f32", "x"), s: float):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = y[i] + s * x[i]


def test_an_eager_call_lets_the_pytorch_op_tune_on_views_and_copies_of_inmut_arrays(monkeypatch):
    """The wiring of the eager tuning, run on the CPU: the PyTorch op gets zero-copy
    views of the In arrays and copies of the InMut ones (it writes them; JAX arrays are
    immutable), and the trace launches the block it chose."""
    f = pnex.jax_op(tuned_axpy)
    x, y = randn(300), randn(300)
    y_before = np.array(y)
    calls, stored = [], {}
    op_call = type(tuned_axpy).__call__

    def spy(self, *args, **kwargs):
        calls.append(args)
        result = op_call(self, *args, **kwargs)
        stored["choice"] = autotune.TuneResult("tuned_axpy", (), "", tuple(
            autotune.CandidateResult(b) for b in tuned_axpy.spec.block_candidates), 1, "benchmarked")
        return result

    monkeypatch.setattr(type(tuned_axpy), "__call__", spy)
    monkeypatch.setattr(jax_frontend, "_concrete_gpu_arrays", lambda arrays: type("Gpu", (), {"id": 0})())
    monkeypatch.setattr(jax_frontend, "_cuda_devices", lambda: (type("Gpu", (), {"id": 0})(),))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda index: __import__("contextlib").nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda index=None: None)
    monkeypatch.setattr(autotune, "stored_choice", lambda *a, **k: stored.get("choice"))
    out = f(x, y, 2.0)
    ((tx, ty, s),) = calls
    assert s == 2.0 and tx.data_ptr() == torch.from_dlpack(x).data_ptr()  # a view of x, no copy
    assert ty.data_ptr() != torch.from_dlpack(y).data_ptr()  # a copy of y, which the op wrote
    np.testing.assert_array_equal(np.asarray(y), y_before)  # the JAX array is as it was
    np.testing.assert_allclose(out, y_before + 2 * np.asarray(x), rtol=1e-6)
    assert [key[2] for key in f._traced] == [((128,), 0)]  # traced with the chosen block (and Tune variant)
    f(x, y, 2.0)
    assert len(calls) == 1  # chosen once


def test_without_a_gpu_the_simulator_runs_the_first_candidate():
    f = pnex.jax_op(tuned_scale)
    x = randn(300)
    assert jax_frontend._stored_block(tuned_scale.definition, [x], {"s": 1.0}) is None
    np.testing.assert_allclose(jax.jit(lambda x: f(x, 2.0))(x), 2 * x, rtol=1e-6)


# ------------------------------------------------------------------------------- the handler, compiled by XLA's CPU compiler

_CPU_XLA = textwrap.dedent(
    """
    import re, sys
    sys.path.insert(0, {benchmarks!r})
    import jax, jax.numpy as jnp
    from jax.interpreters import mlir
    import pnex_magic as pnex
    from pnex_magic.frontends import jax as fj
    from pnex_magic.launch import xla
    import workloads as wl

    jax.devices()  # the CPU backend first: it registers targets queued for it before types
    lib = xla.load_library()
    state, stages = xla.handler_bundle(lib)
    jax.ffi.register_ffi_type(xla.STATE_TYPE, state, platform="cpu")
    jax.ffi.register_ffi_target(xla.TARGET, stages, platform="cpu")
    fj._cuda_archs = lambda: ("9.0",)
    mlir.register_lowering(fj._launch_p, fj._lower_cuda, platform="cpu")  # what a GPU gets, on the CPU
    """
)


def _run_cpu_xla(code: str, env) -> str:
    script = _CPU_XLA.format(benchmarks=str(ROOT / "benchmarks")) + textwrap.dedent(code)
    env = {**env, "JAX_PLATFORMS": "cpu"}  # on a GPU machine too: XLA's CPU compiler, the handler's CPU registration
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@needs_headers
def test_the_stateful_handler_instantiates_when_xla_builds_the_executable(pnex_env):
    out = _run_cpu_xla(
        """
        step = pnex.jax_op(wl.diffusion_step)
        u = jnp.ones((64, 64))
        compiled = jax.jit(lambda u, s: step(u, s, 0.25)).lower(u, u).compile()  # instantiate ran: no error
        print("compiled", "pnex_magic_launch" in compiled.as_text())
        try:
            compiled(u, u)
        except Exception as exc:  # the execute stage needs a CUDA stream
            print("execute:", str(exc).splitlines()[0])
        fj._kernel_id = lambda definition, variant=0: 12345  # an id nothing registered
        try:
            jax.jit(lambda u, s: step(u, s, 0.5)).lower(u, u).compile()
        except Exception as exc:
            print("unknown:", str(exc).splitlines()[0])
        """,
        pnex_env,
    )
    assert "compiled True" in out
    assert "execute: INVALID_ARGUMENT: [execute] Failed to decode" in out  # operand 0, the stream
    assert "unknown:" in out and "pnex: no kernel with id 12345 is registered in this process" in out


@needs_headers
def test_a_ping_pong_pair_that_keeps_its_slots_needs_no_copy_in_the_loop_body(pnex_env):
    out = _run_cpu_xla(
        r"""
        step = pnex.jax_op(wl.diffusion_step)
        N = 128

        def swapped(u0):  # the carry swaps its buffers every step
            return jax.lax.fori_loop(0, 10, lambda i, c: (step(c[0], c[1], 0.25), c[0]), (u0, jnp.zeros_like(u0)))[0]

        def pair(u0):  # two steps per iteration, each buffer back in its slot
            def body(i, carry):
                u, s = carry
                s = step(u, s, 0.25)
                return step(s, u, 0.25), s
            return jax.lax.fori_loop(0, 5, body, (u0, jnp.zeros_like(u0)))[0]

        def computations(text):
            found, name = {}, None
            for line in text.splitlines():
                head = re.match(r"(?:ENTRY )?(%[\w.\-]+) .*\{$", line)
                if head:
                    name = head.group(1)
                    found[name] = []
                elif name is not None:
                    found[name].append(line)
            return found

        def copies(text):  # f32[N,N] copies in the while bodies, and elsewhere
            bodies = set(re.findall(r"body=(%[\w.\-]+)", text))
            counts = [0, 0]
            for name, lines in computations(text).items():
                n = sum(bool(re.search(r"= f32\[%d,%d\]\S* copy\(" % (N, N), line)) for line in lines)
                counts[name not in bodies] += n
            return counts

        u = jnp.ones((N, N))
        for f in (swapped, pair):
            for donate in ((), (0,)):
                text = jax.jit(f, donate_argnums=donate).lower(u).compile().as_text()
                print(f.__name__, donate, *copies(text), text.count("conditional("))
        """,
        pnex_env,
    )
    rows = {tuple(line.split()[:2]): tuple(map(int, line.split()[2:])) for line in out.splitlines()
            if line.startswith(("swapped", "pair"))}
    # (copies in the while body, copies elsewhere, conditionals)
    assert rows[("pair", "()")] == (0, 1, 0)  # u0's buffer, which the caller keeps
    assert rows[("pair", "(0,)")] == (0, 0, 0)  # donated: none at all
    assert rows[("swapped", "()")][0] == 4  # what the notebook's old loop cost per step


# ------------------------------------------------------------------------------- first use


@needs_headers
def test_a_built_handler_is_found_without_looking_for_the_cuda_headers(pnex_env):
    xla.build_library()
    code = (
        "import sys; from pnex_magic.launch import xla; path = xla.build_library(); "
        "print(path.name, 'torch.utils.cpp_extension' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=pnex_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["libpnex_jax_ffi.so", "False"]


_FIRST_USE = """
import torch
from pnex_magic import cache, compiler
from numba import cuda

def no_compile(*args, **kwargs):
    raise AssertionError("Numba compiled a kernel")

cache.stats.reset()  # the harness's workloads defined kernels of their own

if sys.argv[1] == "hit":  # nothing may compile: the definition loads the cache entry, JAX reuses it
    compiler._numba_ptx = no_compile
source = '''
@pnex.jit(n_threads="x.numel()")
def add_salt(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + SALT
'''.replace("SALT", sys.argv[2])
import linecache  # its source where inspect finds it (the simulator rewrites a kernel's source), as %%pnex does
linecache.cache["<first use>"] = (len(source), None, source.splitlines(True), "<first use>")
exec(compile(source, "<first use>", "exec"))
if sys.argv[1] == "torch-first":
    assert float(add_salt(torch.ones(4))[0]) == 1 + float(sys.argv[2])
    compiler._numba_ptx = no_compile  # JAX must reuse what the PyTorch op has
defined = dict(variants=len(add_salt.definition._compiled), hits=cache.stats.hits, misses=cache.stats.misses)
compiled = jax.jit(pnex.jax_op(add_salt)).lower(jnp.ones(4)).compile()  # the GPU's lowering: the kernel registered
print("DEFINED", defined["variants"], defined["hits"], defined["misses"])
print("JAX", len(add_salt.definition._compiled) - defined["variants"], cache.stats.hits - defined["hits"],
      cache.stats.misses - defined["misses"], "pnex_magic_launch" in compiled.as_text())
"""


@pytest.mark.slow
@needs_headers
def test_first_use_in_jax_compiles_once_and_a_cache_hit_compiles_nothing(pnex_env, tmp_path):
    """Issue 17's first use, through the GPU's lowering (XLA's CPU compiler): a new kernel
    is compiled once, when it is defined, and JAX registers that code with the handler
    (no second compile, no cache lookup); the unchanged kernel in a fresh process is a
    disk-cache hit that runs no Numba compile; a kernel the PyTorch op already ran is
    reused likewise.  PNEX_ARCH stands in for the GPU's architecture (sm_90, as the
    handler is told the GPU is)."""
    salt = str(uuid.uuid4().int % 1000)
    env = {**pnex_env, "PNEX_ARCH": "sm_90"}
    script = _CPU_XLA.format(benchmarks=str(ROOT / "benchmarks")) + _FIRST_USE

    def first_use(mode: str, salt: str) -> list[list[str]]:
        out = subprocess.run([sys.executable, "-c", script, mode, salt], capture_output=True, text=True,
                             env={**env, "JAX_PLATFORMS": "cpu"}, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return [line.split()[1:] for line in out.stdout.splitlines() if line.startswith(("DEFINED", "JAX"))]

    # (compiled variants, cache hits, cache misses) after the definition; then what JAX added
    assert first_use("new", salt) == [["1", "0", "1"], ["0", "0", "0", "True"]]
    assert first_use("hit", salt) == [["1", "1", "0"], ["0", "0", "0", "True"]]
    assert first_use("torch-first", f"{salt}.5") == [["1", "0", "1"], ["0", "0", "0", "True"]]
