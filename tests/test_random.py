"""Random numbers in kernels (issue 26, case 5).

``pnex.random`` (Philox4x32-10): bit-exact against Random123's published answers and a
vectorised NumPy reference written here from the algorithm; the same numbers in the
simulator and on the GPU; statistically sane (mean, variance, no correlation between
neighbouring offsets nor between consecutive calls); a ``Seed`` drawn from torch's
generator per call (reproducible with ``torch.manual_seed``, new numbers per call, under
``torch.compile`` and, on a GPU, per CUDA-graph replay).  Numba's xoroshiro128p states as
an ``InMut("xoroshiro128p", ...)`` parameter: the same streams as Numba's, advanced the same
way, and clear errors for what is not."""


import contextlib
import math

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import random as prandom
from pnex_magic.errors import (
    ArgumentShapeError,
    ArgumentTypeError,
    KernelDefinitionError,
    KernelLaunchError,
    KernelTypingError,
)
from pnex_magic.launch.description import describe_launch

from toolchain import needs_nvvm

# ---------------------------------------------------------------------------- an independent reference

# Random123's tests/kat_vectors, the three "philox4x32 10" lines: counter (4 words), key (2), result (4).
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox_reference(key0, key1, c0, c1, c2, c3):
    """Philox4x32-10 on NumPy uint64 arrays of 32-bit words, written from Salmon et al.'s
    description (Random123's philox.h): key bumped before rounds 2..10."""
    m0, m1, w0, w1, low = (np.uint64(v) for v in (0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF))
    k0, k1 = np.asarray(key0, np.uint64), np.asarray(key1, np.uint64)
    x = [np.asarray(c, np.uint64) for c in (c0, c1, c2, c3)]
    for r in range(10):
        if r:
            k0, k1 = (k0 + w0) & low, (k1 + w1) & low
        hi0, lo0 = (m0 * x[0]) >> np.uint64(32), (m0 * x[0]) & low
        hi1, lo1 = (m1 * x[2]) >> np.uint64(32), (m1 * x[2]) & low
        x = [hi1 ^ x[1] ^ k0, lo1, hi0 ^ x[3] ^ k1, lo0]
    return [v.astype(np.uint32) for v in x]


def reference_words(seed: int, offsets: np.ndarray):
    """The four words pnex.random.randint4x(seed, offset) documents: key = seed's halves,
    counter = (offset low, offset high, 0, 0)."""
    s = seed & (2**64 - 1)
    o = offsets.astype(np.int64).view(np.uint64)
    low = np.uint64(0xFFFFFFFF)
    zero = np.zeros_like(o)
    return philox_reference(s & 0xFFFFFFFF, s >> 32, o & low, o >> np.uint64(32), zero, zero)


def reference_uniform(seed, offsets):
    return (reference_words(seed, offsets)[0] >> 8).astype(np.float32) * np.float32(2.0**-24)


def reference_uniform_f64(seed, offsets):
    a, b, _, _ = reference_words(seed, offsets)
    bits = (b.astype(np.uint64) << np.uint64(21)) | (a.astype(np.uint64) >> np.uint64(11))
    return bits.astype(np.float64) * 2.0**-53


def reference_normal(seed, offsets):
    a, b, _, _ = reference_words(seed, offsets)
    u1 = ((a >> 8).astype(np.float64) + 1) * 2.0**-24
    u2 = (b >> 8).astype(np.float64) * 2.0**-24
    return np.sqrt(-2 * np.log(u1)) * np.cos(2 * math.pi * u2)


# ---------------------------------------------------------------------------- bit-exact


def test_philox_gives_random123s_known_answers():
    for counter, (k0, k1), expected in KAT:
        assert tuple(int(v) for v in prandom.philox(k0 | (k1 << 32), *counter)) == expected
        assert tuple(int(v[()]) for v in philox_reference(k0, k1, *counter)) == expected


def test_every_function_matches_the_reference_bit_for_bit():
    rng = np.random.default_rng(2026)
    seeds = [0, 1, -1, 2**63 - 1, -(2**63), *(int(s) for s in rng.integers(-(2**63), 2**63, 6, dtype=np.int64))]
    offsets = np.concatenate([[0, 1, -1, 2**32 - 1, 2**32, 2**62], rng.integers(-(2**62), 2**62, 40)]).astype(np.int64)
    for seed in seeds:
        words = reference_words(seed, offsets)
        uniforms, doubles, normals = (reference_uniform(seed, offsets), reference_uniform_f64(seed, offsets),
                                      reference_normal(seed, offsets))
        for j, offset in enumerate(offsets.tolist()):
            assert [int(v) for v in prandom.randint4x(seed, offset)] == [int(w[j]) for w in words]
            assert int(prandom.randint(seed, offset)) == int(words[0][j])
            assert prandom.uniform(seed, offset) == uniforms[j]
            assert prandom.uniform4(seed, offset)[1] == np.float32((words[1][j] >> 8) * np.float32(2.0**-24))
            assert prandom.uniform_f64(seed, offset) == doubles[j]
            assert prandom.normal(seed, offset) == pytest.approx(normals[j], rel=2e-6, abs=2e-6)


def test_uniforms_stay_below_one_and_normals_stay_finite():
    # The extremes of the 24-bit conversion: all-ones words give the largest uniform and
    # the smallest u1 of Box-Muller (never log(0)).
    top = np.float32((0xFFFFFFFF >> 8) * 2.0**-24)
    assert top < 1.0 and prandom._unit24(np.uint32(0xFFFFFFFF)) == top
    z0, z1 = prandom._box_muller32(np.uint32(0), np.uint32(0))
    assert np.isfinite(z0) and np.isfinite(z1) and abs(z0) > 5  # u1 = 2**-24: the largest radius


def _draws(n_threads: int, per_thread: int, which: str):
    """A kernel drawing per_thread numbers per thread, at offsets thread + k * n_threads."""
    functions = {"uniform": prandom.uniform, "normal": prandom.normal, "uniform_f64": prandom.uniform_f64}
    draw = functions[which]
    dtype = "f64" if which.endswith("f64") else "f32"

    def draws(out: pnex.Out(dtype, (per_thread, n_threads)), seed: pnex.Seed):
        i = cuda.grid(1)
        if i < out.shape[1]:
            for k in range(out.shape[0]):
                out[k, i] = draw(seed, i + k * out.shape[1])

    draws.__qualname__ = f"draws_{which}"  # an op per kind (an op's name follows where it was defined)
    return pnex.jit(n_threads="out.size(1)", threads_per_block=32)(draws)


def test_a_seed_parameter_draws_from_torchs_generator_once_per_call():
    op = _draws(64, 4, "uniform")
    torch.manual_seed(11)
    expected_seed = int(prandom.draw_seed("cpu").item())
    torch.manual_seed(11)
    first = op()
    offsets = np.arange(4 * 64).reshape(4, 64)
    np.testing.assert_array_equal(first.numpy(), reference_uniform(expected_seed, offsets.ravel()).reshape(4, 64))
    second = op()
    assert not torch.equal(first, second)  # a new seed per call
    torch.manual_seed(11)
    assert torch.equal(op(), first)  # reproducible
    assert "seed" not in op.spec.schema and len(op.spec.seeds) == 1


def test_the_simulator_gives_the_references_numbers_for_every_function():
    @pnex.jit(n_threads="offsets.size(0)", threads_per_block=16)
    def every(offsets: pnex.In("i64", (None,)), seed: "i64", words: pnex.Out("u32", ("offsets.size(0)", 4)),
              u: pnex.Out("f32", ("offsets.size(0)", 4)), d: pnex.Out("f64", "offsets"),
              z: pnex.Out("f32", ("offsets.size(0)", 4)), zd: pnex.Out("f64", "offsets")):
        i = cuda.grid(1)
        if i < offsets.shape[0]:
            o = offsets[i]
            a, b, c, e = pnex.random.randint4x(seed, o)
            words[i, 0], words[i, 1], words[i, 2], words[i, 3] = a, b, c, e
            u[i, 0], u[i, 1], u[i, 2], u[i, 3] = pnex.random.uniform4(seed, o)
            d[i] = pnex.random.uniform_f64(seed, o)
            z[i, 0], z[i, 1], z[i, 2], z[i, 3] = pnex.random.normal4(seed, o)
            zd[i] = pnex.random.normal_f64(seed, o)

    rng = np.random.default_rng(7)
    offsets = torch.tensor(rng.integers(-(2**62), 2**62, 48))
    seed = int(rng.integers(-(2**63), 2**63, dtype=np.int64))
    words, u, d, z, zd = every(offsets, seed)
    ref = reference_words(seed, offsets.numpy())
    np.testing.assert_array_equal(words.numpy().astype(np.uint32), np.stack(ref, 1))
    np.testing.assert_array_equal(u.numpy(), np.stack([(w >> 8).astype(np.float32) * np.float32(2.0**-24)
                                                        for w in ref], 1))
    np.testing.assert_array_equal(d.numpy(), reference_uniform_f64(seed, offsets.numpy()))
    np.testing.assert_allclose(z.numpy()[:, 0], reference_normal(seed, offsets.numpy()), rtol=2e-6, atol=2e-6)
    assert np.isfinite(zd.numpy()).all()


# ---------------------------------------------------------------------------- statistics


def _stats_ok(x: np.ndarray, mean: float, var: float, fourth: float) -> None:
    """Mean and variance within 5 standard errors (a chance of about 1e-6 each)."""
    n = x.size
    assert abs(x.mean() - mean) < 5 * math.sqrt(var / n), (x.mean(), mean)
    assert abs(x.var() - var) < 5 * math.sqrt((fourth - var**2) / n), (x.var(), var)


def _uncorrelated(a: np.ndarray, b: np.ndarray) -> None:
    r = np.corrcoef(a, b)[0, 1]
    assert abs(r) < 5 / math.sqrt(a.size), r


def test_statistics_of_python_draws():
    n = 20_000
    u = np.array([prandom.uniform(0x5EED, i) for i in range(n)], np.float64)
    _stats_ok(u, 0.5, 1 / 12, 1 / 80)
    _uncorrelated(u[:-1], u[1:])
    z = np.array([prandom.normal(0x5EED, i) for i in range(n)], np.float64)
    _stats_ok(z, 0.0, 1.0, 3.0)
    _uncorrelated(z[:-1], z[1:])


def test_statistics_of_simulated_kernel_draws_and_of_consecutive_calls():
    op = _draws(128, 16, "uniform")
    torch.manual_seed(3)
    first, second = op().numpy().astype(np.float64), op().numpy().astype(np.float64)
    _stats_ok(first.ravel(), 0.5, 1 / 12, 1 / 80)
    _uncorrelated(first[:, :-1].ravel(), first[:, 1:].ravel())  # neighbouring threads
    _uncorrelated(first.ravel(), second.ravel())  # consecutive calls


# ---------------------------------------------------------------------------- torch.compile, errors


def test_under_torch_compile_a_call_draws_as_in_eager():
    op = _draws(32, 2, "normal")

    @torch.compile(fullgraph=True, backend="aot_eager")
    def twice(scale: torch.Tensor):
        return op() * scale

    torch.manual_seed(5)
    eager = op()
    torch.manual_seed(5)
    compiled = twice(torch.tensor(2.0))
    torch.testing.assert_close(compiled, eager * 2.0)
    assert not torch.equal(twice(torch.tensor(2.0)), compiled)


@contextlib.contextmanager
def default_device(device: str):
    """``torch.set_default_device(device)`` inside the block (compiled code sees it too)."""
    before = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(before)


def test_an_op_of_scalars_only_makes_its_outputs_on_torchs_default_device():
    """Both ways of setting it, read where the op is called (inside the op torch sets a
    ``with torch.device`` block aside, and fills a missing index on the CPU): the launch
    on 'meta' tensors is refused, which names the device the outputs were made on."""
    op = _draws(8, 1, "uniform")
    assert op().device.type == "cpu"
    with torch.device("meta"), pytest.raises(KernelLaunchError, match="'meta' tensors"):
        op()
    with default_device("meta"):
        with pytest.raises(KernelLaunchError, match="'meta' tensors"):
            op()
        with pytest.raises(KernelLaunchError, match="'meta' tensors"):
            op._opoverload()  # through the dispatcher alone (as compiled code calls it)
    assert op().device.type == "cpu"


def test_seed_misuse_is_a_clear_error():
    with pytest.raises(KernelDefinitionError, match=r"parameter 'seed'.*Seed parameter \(each call draws it\)"):
        @pnex.jit(n_threads="out.size(0)")
        def with_default(out: pnex.Out("f32", (4,)), seed: pnex.Seed = 1):
            pass

    op = _draws(32, 1, "uniform")
    with pytest.raises(ArgumentTypeError, match="takes 0 argument"):
        op(torch.zeros(1, dtype=torch.int64))
    jax = pytest.importorskip("jax")  # noqa: F841
    with pytest.raises(KernelDefinitionError, match=r"Seed parameter\(s\) \(seed\).*JAX functions are pure"):
        pnex.jax_op(op)


@needs_nvvm
def test_an_offset_that_is_not_an_integer_is_a_typing_error_that_says_so():
    with pytest.raises(KernelTypingError, match=r"pnex.random: offsets and counter words are integers"):
        @pnex.jit(n_threads="out.size(0)")
        def float_offset(out: pnex.Out("f32", (4,)), seed: pnex.Seed):
            out[0] = pnex.random.uniform(seed, 0.5)


@needs_nvvm
def test_a_seed_is_a_one_element_array_in_the_compiled_kernel_and_in_saved_artifacts(tmp_path):
    op = _draws(32, 1, "uniform")
    entry = describe_launch(op.spec)["params"][1]
    assert entry["kind"] == 6 and entry["describe"] == "Seed"
    path = pnex.save(op, tmp_path / "draws.pnex", archs=("sm_80",))
    from pnex_magic.artifact.archive import read_archive
    from pnex_magic.artifact.manifest import read_op_entry

    manifest, files = read_archive(path)
    assert [p.role for p in read_op_entry(manifest["ops"][0], files, str(path)).spec.params] == ["out", "seed"]


def test_the_report_shows_a_seed_parameter_and_record_states():
    from pnex_magic.render.report import PnexReport

    op = _draws(32, 1, "uniform")
    html = PnexReport.from_kernel(pnex.build_report(op, args=()), op, "draws")._repr_mimebundle_()["text/html"]
    assert "drawn per call from torch" in html
    states = pnex.xoroshiro128p_states(16, seed=3)
    text = str(pnex.build_report(_two_draws(), args=(states,)))
    assert "Tensor[xoroshiro128p, (None,)]" in text


# ---------------------------------------------------------------------------- Numba's xoroshiro128p states


def _two_draws():
    """Two draws per state: Numba's float64 uniform, then its float32 one."""
    from numba.cuda.random import xoroshiro128p_uniform_float32, xoroshiro128p_uniform_float64

    @pnex.jit(n_threads="rng_states.size(0)", threads_per_block=16)
    def two_draws(rng_states: pnex.InMut("xoroshiro128p", (None,)), out: pnex.Out("f64", ("rng_states.size(0)", 2))):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i, 0] = xoroshiro128p_uniform_float64(rng_states, i)
            out[i, 1] = xoroshiro128p_uniform_float32(rng_states, i)

    return two_draws


def _two_draws_reference(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    first, states = _advanced(_numba_states(n, seed).view(np.uint64).reshape(n, 2))
    second, states = _advanced(states)
    unit = lambda r: (r >> np.uint64(11)).astype(np.float64) * 2.0**-53  # noqa: E731
    return np.stack([unit(first), unit(second).astype(np.float32).astype(np.float64)], 1), states


def _numba_states(n: int, seed: int) -> np.ndarray:
    from numba.cuda.random import init_xoroshiro128p_states_cpu, xoroshiro128p_dtype

    states = np.empty(n, dtype=xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, seed, 0)
    return states


def _advanced(states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numba's xoroshiro128+ step on every state ((n, 2) uint64 words; NumPy, vectorised):
    the uint64 each returns and the states after it."""
    s = states.copy()
    s0, s1 = s[:, 0].copy(), s[:, 1].copy()
    with np.errstate(over="ignore"):
        result = s0 + s1
    s1 ^= s0
    rot = lambda x, k: (x << np.uint64(k)) | (x >> np.uint64(64 - k))  # noqa: E731
    s[:, 0] = rot(s0, 55) ^ s1 ^ (s1 << np.uint64(14))
    s[:, 1] = rot(s1, 36)
    return result, s


def test_xoroshiro128p_states_are_numbas_streams():
    states = pnex.xoroshiro128p_states(37, seed=42)
    assert states.dtype == torch.uint64 and states.shape == (37, 2)
    np.testing.assert_array_equal(states.numpy(), _numba_states(37, 42).view(np.uint64).reshape(37, 2))


def test_numbas_generators_run_on_the_states_and_advance_them_as_numba_does():
    n = 48
    states = pnex.xoroshiro128p_states(n, seed=7)
    out = _two_draws()(states)
    expected, after = _two_draws_reference(n, 7)
    np.testing.assert_array_equal(out.numpy(), expected)
    np.testing.assert_array_equal(states.numpy(), after)


def test_states_the_kernel_cannot_read_are_refused_clearly():
    op = _two_draws()
    states = pnex.xoroshiro128p_states(8, seed=1)
    for bad in (states[:, :1].contiguous(), states.t().contiguous().t(), states.view(torch.int64).reshape(16)):
        with pytest.raises((ArgumentShapeError, ArgumentTypeError), match=r"rng_states"):
            op(bad)
    with pytest.raises(ArgumentShapeError, match=r"holds xoroshiro128p states .*a \(n, 2\) torch.uint64 tensor"):
        op(states[:, :1].contiguous())
    with pytest.raises(ArgumentTypeError, match=r"pnex.xoroshiro128p_states\(n, seed, device\)"):
        op(states.numpy())


def test_record_states_cannot_be_an_output_or_a_scalar():
    with pytest.raises(KernelDefinitionError, match=r"xoroshiro128p states cannot be an Out tensor"):
        @pnex.jit(n_threads="s.size(0)")
        def makes_states(s: pnex.Out("xoroshiro128p", (8,))):
            pass
    with pytest.raises(KernelDefinitionError, match=r"cannot be a scalar"):
        @pnex.jit(n_threads="x.size(0)")
        def scalar_state(x: pnex.InMut("f32", (None,)), s: "xoroshiro128p"):
            pass


@needs_nvvm
def test_a_uint64_view_of_the_states_gets_a_typing_error_that_names_the_recipe():
    from numba.cuda.random import xoroshiro128p_uniform_float32

    with pytest.raises(KernelTypingError, match=r"InMut\('xoroshiro128p', \(None,\)\).*pnex.xoroshiro128p_states"):
        @pnex.jit(n_threads="out.size(0)")
        def uint64_view(out: pnex.InMut("f32", (None,)), rng_states: pnex.InMut("u64", ("out.size(0)", 2))):
            gid = cuda.grid(1)
            if gid < len(out):
                out[gid] = xoroshiro128p_uniform_float32(rng_states, gid)


def test_the_launchers_see_records_of_16_bytes_without_the_words_axis():
    entry = describe_launch(_two_draws().spec)["params"][0]
    assert (entry["dtype"], entry["itemsize"], entry["ndim"], entry["lanes"]) == ("uint64", 16, 1, 2)
    assert "pnex.xoroshiro128p_states" in entry["record_message"]
    assert "lanes" not in describe_launch(_two_draws().spec)["params"][1]  # other parameters' entries as before


# ---------------------------------------------------------------------------- on a GPU


@pytest.fixture
def on_cuda():
    """An op whose arguments are all scalars (and a ``Seed``) makes its outputs on torch's
    default device, as ``torch.empty`` does: make that the GPU for these tests (with
    ``torch.set_default_device``, which compiled code sees too)."""
    with default_device("cuda"):
        yield


def _gpu_every():
    @pnex.jit(n_threads="n", threads_per_block=256)
    def every_gpu(n: int, seed: "i64", u: pnex.Out("f32", ("n",)), d: pnex.Out("f64", ("n",)),
                  z: pnex.Out("f32", ("n",)), w: pnex.Out("u32", ("n",))):
        i = cuda.grid(1)
        if i < n:
            u[i] = pnex.random.uniform(seed, i)
            d[i] = pnex.random.uniform_f64(seed, i)
            z[i] = pnex.random.normal(seed, i)
            w[i] = pnex.random.randint(seed, i)

    return every_gpu


@pytest.mark.gpu
def test_the_gpu_gives_the_same_numbers_as_the_reference_and_the_simulator(gpu_cache, launcher, on_cuda):
    op = _gpu_every()
    seed = -123456789012345
    outs = op(1 << 16, seed)
    assert all(t.is_cuda for t in outs)  # on the GPU, not the simulator
    u, d, z, w = (t.cpu().numpy() for t in outs)
    offsets = np.arange(1 << 16)
    np.testing.assert_array_equal(u, reference_uniform(seed, offsets))
    np.testing.assert_array_equal(d, reference_uniform_f64(seed, offsets))
    np.testing.assert_array_equal(w.astype(np.uint32), reference_words(seed, offsets)[0])
    np.testing.assert_allclose(z, reference_normal(seed, offsets), rtol=2e-6, atol=2e-6)
    with torch.device("cpu"):
        cu, cd, cz, cw = (t.numpy() for t in op(64, seed))  # the simulator, on CPU tensors
    np.testing.assert_array_equal(cu, u[:64])
    np.testing.assert_array_equal(cd, d[:64])
    np.testing.assert_array_equal(cw, w[:64])
    np.testing.assert_allclose(cz, z[:64], rtol=2e-6, atol=2e-6)


@pytest.mark.gpu
def test_ten_million_gpu_draws_are_statistically_sane(gpu_cache, on_cuda):
    op = _gpu_every()
    n = 10_000_000
    u, d, z, _ = (t.double() for t in op(n, 20261125))
    for x, mean, var, fourth in ((u, 0.5, 1 / 12, 1 / 80), (d, 0.5, 1 / 12, 1 / 80), (z, 0.0, 1.0, 3.0)):
        assert abs(x.mean().item() - mean) < 5 * math.sqrt(var / n)
        assert abs(x.var().item() - var) < 5 * math.sqrt((fourth - var**2) / n)
        r = torch.corrcoef(torch.stack([x[:-1], x[1:]]))[0, 1].item()
        assert abs(r) < 5 / math.sqrt(n)
    second = op(n, 20261126)[0].double()
    assert abs(torch.corrcoef(torch.stack([u, second]))[0, 1].item()) < 5 / math.sqrt(n)


@pytest.mark.gpu
def test_seeded_calls_are_reproducible_and_the_same_on_both_launchers(gpu_cache, launcher, monkeypatch, on_cuda):
    op = _draws(1 << 14, 4, "uniform")
    torch.manual_seed(99)
    first, second = op(), op()
    assert not torch.equal(first, second)
    torch.manual_seed(99)
    expected = int(prandom.draw_seed("cuda").item())
    offsets = np.arange(4 << 14)
    np.testing.assert_array_equal(first.cpu().numpy().ravel(), reference_uniform(expected, offsets))


@pytest.mark.gpu
def test_each_cuda_graph_replay_draws_new_numbers(gpu_cache, launcher, on_cuda):
    op = _draws(1 << 12, 1, "uniform")
    op()  # loads the code outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op()
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(out.clone())
    torch.cuda.synchronize()
    assert not torch.equal(replays[0], replays[1]) and not torch.equal(replays[1], replays[2])
    for r in replays:
        assert abs(r.double().mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / r.numel())


@pytest.mark.gpu
def test_torch_compile_reduce_overhead_draws_per_call(gpu_cache, on_cuda):
    op = _draws(1 << 12, 1, "normal")

    @torch.compile(mode="reduce-overhead")
    def noisy(x):
        return x + op()

    x = torch.zeros(1, 1 << 12, device="cuda")
    results = [noisy(x).clone() for _ in range(4)]
    assert all(not torch.equal(a, b) for a, b in zip(results, results[1:]))


@pytest.mark.gpu
def test_xoroshiro128p_states_on_the_gpu_advance_as_numbas(gpu_cache, launcher):
    n = 1 << 16
    states = pnex.xoroshiro128p_states(n, seed=42, device="cuda")
    out = _two_draws()(states)
    expected, after = _two_draws_reference(n, 42)
    np.testing.assert_array_equal(out.cpu().numpy(), expected)
    np.testing.assert_array_equal(states.cpu().numpy(), after)
