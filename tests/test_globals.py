"""Globals never make a result stale, wrong or fatal (issue 26): one snapshot of what a
kernel reads, taken when it is defined, for every compiled form and the simulator;
device arrays read as globals passed as hidden arguments; a cache key that changes
exactly when the code does.  GPU forms of these tests are in
``tests/test_numba_doc_examples.py`` and ``tests/test_gpu_globals.py``."""

from __future__ import annotations

import importlib.util
import random
import re
import sys
import textwrap
import types

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import compiler
from pnex_magic.define import definition as make_definition
from pnex_magic.errors import (
    ArgumentTypeError,
    ArtifactError,
    KernelDefinitionError,
    KernelIndexError,
    KernelLaunchError,
)
from pnex_magic.launch import autotune, checks

# --------------------------------------------------------------------------- the cache key

# A kernel that reads one global of every kind the snapshot freezes; each one's value
# reaches the result, so a change of value is a change of the code (or, for the device
# array, of its type only: its contents and address are arguments).
_MUTATION_SOURCE = '''
import numpy as np
import torch
from numba import cuda
import pnex_magic as pnex
import {config}

SCALE = 2.0
PAIR = (1.0, 2.0)
TABLE = np.array([1.0, 2.0], dtype=np.float32)
DEVICE = torch.zeros(3)
UNREAD = 1


@cuda.jit(device=True)
def helper_add(x):
    return x + 1.5


@cuda.jit(device=True)
def helper_mul(x):
    return x * 1.5


helper = helper_add


def make(offset):
    def kernel(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = (helper(a[i]) * SCALE + PAIR[0] * PAIR[1] + TABLE[i % TABLE.shape[0]]
                      + {config}.FACTOR + offset + DEVICE.flat[0])

    return kernel
'''

_PTX_NOISE = (re.compile(r"_Z\w+"), re.compile(r"_cudapy_\w*?_?\d+"))


def _normalized(ptx: str) -> str:
    for pattern in _PTX_NOISE:
        ptx = pattern.sub("SYM", ptx)
    return ptx


def _load_module(tmp_path, name: str, source: str) -> types.ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _state(rng: random.Random) -> dict:
    dtype = rng.choice(["float32", "float64"])
    return {
        "SCALE": rng.choice([2.0, 3.0, 0.5]),
        "PAIR": (rng.choice([1.0, 4.0]), rng.choice([2.0, 8.0])),
        "TABLE": np.array([rng.randint(1, 9) for _ in range(rng.choice([2, 3]))], dtype=dtype),
        "DEVICE": torch.zeros(*[3] * rng.choice([1, 2]), dtype=rng.choice([torch.float32, torch.float64])),
        "FACTOR": rng.choice([1.0, 7.0]),
        "offset": rng.choice([0.25, 0.75]),
        "helper": rng.choice(["helper_add", "helper_mul"]),
        "UNREAD": rng.randint(0, 100),
    }


# One mutation per kind a kernel's code depends on (or not: the device array's contents
# and address, a global the kernel does not read).
_MUTATIONS = {
    "scalar": lambda s, r: s.update(SCALE=s["SCALE"] + 1.0),
    "tuple": lambda s, r: s.update(PAIR=(s["PAIR"][0], s["PAIR"][1] + 1.0)),
    "array contents": lambda s, r: s.update(TABLE=s["TABLE"] + 1),
    "array dtype": lambda s, r: s.update(TABLE=s["TABLE"].astype(
        np.float64 if s["TABLE"].dtype == np.float32 else np.float32)),
    "array shape": lambda s, r: s.update(TABLE=np.concatenate([s["TABLE"], s["TABLE"][:1]])),
    "array, a new object with the same contents": lambda s, r: s.update(TABLE=s["TABLE"].copy()),
    "module attribute": lambda s, r: s.update(FACTOR=s["FACTOR"] + 2.0),
    "closure value": lambda s, r: s.update(offset=s["offset"] + 1.0),
    "device function body": lambda s, r: s.update(helper="helper_mul" if s["helper"] == "helper_add" else "helper_add"),
    "device array contents": lambda s, r: s["DEVICE"].fill_(r.random()),
    "device array, another tensor (another address)": lambda s, r: s.update(DEVICE=s["DEVICE"].clone() + 1),
    "device array dtype": lambda s, r: s.update(DEVICE=s["DEVICE"].to(
        torch.float64 if s["DEVICE"].dtype == torch.float32 else torch.float32)),
    "device array rank": lambda s, r: s.update(DEVICE=torch.zeros(*[3] * (3 - s["DEVICE"].dim()),
                                                                  dtype=s["DEVICE"].dtype)),
    "a global the kernel does not read": lambda s, r: s.update(UNREAD=s["UNREAD"] + 1),
}


def _key_and_ptx(module, config, state) -> tuple[str, str]:
    for name in ("SCALE", "PAIR", "TABLE", "DEVICE", "UNREAD"):
        setattr(module, name, state[name])
    config.FACTOR = state["FACTOR"]
    module.helper = getattr(module, state["helper"])
    d = make_definition(module.make(state["offset"]), n_threads="a.numel()")
    ptx, _ = compiler._numba_ptx(d.compile_function(), d.spec, (7, 5), "C", 0, d.hidden_arrays)
    return d.cache_key("sm_75"), _normalized(ptx)


def test_the_cache_key_changes_exactly_when_the_code_does(tmp_path, fresh_cache):
    """Randomised: from a random state, each kind of global is changed; the key (taken
    of the snapshot) must change if and only if Numba's PTX for the kernel does."""
    config = _load_module(tmp_path, "pnex_mutation_config", "FACTOR = 1.0\n")
    module = _load_module(tmp_path, "pnex_mutation_kernel", _MUTATION_SOURCE.format(config=config.__name__))
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    changed = {}
    for kind, mutate in _MUTATIONS.items():
        before = _state(rng)
        key_before, ptx_before = _key_and_ptx(module, config, before)
        after = dict(before, DEVICE=before["DEVICE"], TABLE=before["TABLE"].copy())
        mutate(after, rng)
        key_after, ptx_after = _key_and_ptx(module, config, after)
        assert (key_before != key_after) == (ptx_before != ptx_after), (kind, seed)
        changed[kind] = key_before != key_after
    assert changed == {
        kind: kind not in ("array, a new object with the same contents", "device array contents",
                           "device array, another tensor (another address)", "a global the kernel does not read")
        for kind in _MUTATIONS
    }, seed


# --------------------------------------------------------------------------- one snapshot

OFFSET = 1.0
WEIGHTS = np.array([1.0, 2.0, 3.0], dtype=np.float32)


def _module_level_kernel():
    @pnex.jit(n_threads="a.numel()")
    def reads_module_globals(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * WEIGHTS[i % 3] + OFFSET

    return reads_module_globals


def test_every_variant_and_the_simulator_see_the_globals_of_the_definition(fresh_cache, monkeypatch):
    """Case 2 of issue 26: a strided-layout variant, a checked variant and the simulator,
    all made after the globals changed, use the values the definition saw."""
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "OFFSET", 1.0)
    monkeypatch.setattr(this, "WEIGHTS", np.array([1.0, 2.0, 3.0], dtype=np.float32))
    op = _module_level_kernel()
    a = torch.randn(12)
    expected = a * torch.tensor([1.0, 2.0, 3.0]).repeat(4) + 1.0
    monkeypatch.setattr(this, "OFFSET", 100.0)
    this.WEIGHTS[:] = -5.0
    torch.testing.assert_close(op(a), expected)
    big = torch.randn(24)
    torch.testing.assert_close(op(big[::2]), big[::2] * torch.tensor([1.0, 2.0, 3.0]).repeat(4) + 1.0)
    with checks.checked_launches(op.definition):  # the checked variant, made only now
        torch.testing.assert_close(op(a), expected)


def test_redefining_the_kernel_picks_up_new_values(fresh_cache):
    def define(scale):
        @pnex.jit(n_threads="a.numel()")
        def rescaled(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] * scale

        return rescaled

    a = torch.randn(5)
    torch.testing.assert_close(define(2.0)(a), a * 2)
    torch.testing.assert_close(define(3.0)(a), a * 3)


def test_a_module_read_by_a_device_function_and_the_kernel_keeps_what_each_reads(fresh_cache, tmp_path):
    """One frozen copy of a module gains the attributes of every reader: here a device
    function of another file reads ``config.OFFSET`` and the kernel ``config.SCALE`` (as
    the GEMM examples' shared epilogue reads ``pnex.tc.store_words`` and their kernels
    ``pnex.tc.tile``).  The first reader's copy used to be the only one: the kernel then
    failed to compile, "module ... has no attribute 'SCALE'"."""
    config = _load_module(tmp_path, "pnex_two_readers_config", "OFFSET = 1.5\nSCALE = 3.0\n")
    helper = _load_module(tmp_path, "pnex_two_readers_helper", textwrap.dedent("""
        from numba import cuda
        import pnex_two_readers_config as config

        @cuda.jit(device=True)
        def shifted(x):
            return x + config.OFFSET
        """))
    shifted = helper.shifted

    def define():
        @pnex.jit(n_threads="a.numel()")
        def two_readers(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = shifted(a[i]) * config.SCALE

        return two_readers

    a = torch.randn(7)
    torch.testing.assert_close(define()(a), (a + 1.5) * 3.0)
    config.SCALE, config.OFFSET = 5.0, -2.0  # read at definition: a new definition sees both
    torch.testing.assert_close(define()(a), (a - 2.0) * 5.0)


def test_from_numba_import_cuda_inside_the_defining_function_runs_in_the_simulator(fresh_cache):
    """Case 7 of issue 26: ``cuda`` is then a closure variable of the kernel (and of its
    device function), which numba-cuda's simulator does not swap for its fake module."""
    from numba import cuda as local_cuda

    @local_cuda.jit(device=True)
    def lane(x):
        return x + local_cuda.threadIdx.x * 0 + local_cuda.blockDim.x * 0

    @pnex.jit(n_threads="a.numel()", threads_per_block=8)
    def closure_cuda(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        shared = local_cuda.shared.array(8, dtype=np.float32)
        i = local_cuda.grid(1)
        t = local_cuda.threadIdx.x
        if i < a.shape[0]:
            shared[t] = a[i]
        local_cuda.syncthreads()
        if i < a.shape[0]:
            out[i] = lane(shared[t]) * 2

    a = torch.randn(20)
    torch.testing.assert_close(closure_cuda(a), a * 2)


def test_cuda_cpp_on_cpu_tensors_is_refused_naming_the_function(fresh_cache, tmp_path):
    """Case 8 of issue 26 (the ports in examples/numba_docs/ cover link=, declare_device and
    ffi.from_buffer); here through a device function, declared without code to link."""
    mul = cuda.declare_device("pnex_test_mul", "float32(float32, float32)")

    @cuda.jit(device=True)
    def twice(x):
        return mul(x, 2.0)

    def foreign(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = twice(a[i])

    d = make_definition(foreign, n_threads="a.numel()")
    assert d.snapshot.foreign == ("pnex_test_mul",)
    with pytest.raises(KernelLaunchError, match=r"kernel 'foreign' calls CUDA C\+\+ \('pnex_test_mul', declared with "
                                                r"cuda.declare_device\).*runs on a GPU only: pass CUDA tensors"):
        d.simulated_function()


# --------------------------------------------------------------------------- hidden arguments

LOOKUP = torch.zeros(4)


def reads_lookup(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] + LOOKUP[i % 4]


def _reads_lookup():
    return pnex.jit(n_threads="a.numel()")(reads_lookup)


def test_a_cpu_tensor_global_is_read_in_place_at_every_call(fresh_cache, monkeypatch):
    """Case 9 of issue 26: a CPU tensor read as a global is a hidden argument; the
    simulator reads the tensor itself, so an in-place update is seen by the next call,
    and rebinding the global is not (as Numba: the definition holds the object)."""
    this = sys.modules[__name__]
    table = torch.randn(4)
    monkeypatch.setattr(this, "LOOKUP", table)
    op = _reads_lookup()
    [hidden] = op.definition.hidden_arrays
    assert (hidden.name, hidden.dtype.name, hidden.ndim, hidden.contiguous) == ("LOOKUP", "float32", 1, True)
    a = torch.randn(10)
    torch.testing.assert_close(op(a), a + table.repeat(3)[:10])
    table.mul_(-3.0)  # in place: seen
    torch.testing.assert_close(op(a), a + table.repeat(3)[:10])
    monkeypatch.setattr(this, "LOOKUP", torch.full((4,), 99.0))  # rebound: not seen
    torch.testing.assert_close(op(a), a + table.repeat(3)[:10])
    if op.definition.compiles:
        assert op.definition.compiled().ptx_params == [8] * (7 + 7 + 7)  # a, out, then LOOKUP's slots


def test_the_key_of_a_device_array_global_is_its_type_not_its_contents_or_address(fresh_cache, monkeypatch):
    this = sys.modules[__name__]
    keys = []
    for table in (torch.randn(4), torch.randn(4), torch.randn(9)[::2], torch.randn(4, dtype=torch.float64)):
        monkeypatch.setattr(this, "LOOKUP", table)
        keys.append(make_definition(reads_lookup, n_threads="a.numel()").source_key)
    assert keys[0] == keys[1]  # other contents, another address
    assert len({keys[0], keys[2], keys[3]}) == 3  # strided, float64: other code


def test_a_hidden_argument_on_another_device_or_of_another_type_is_refused_naming_it(fresh_cache, monkeypatch):
    this = sys.modules[__name__]
    table = torch.randn(4)
    monkeypatch.setattr(this, "LOOKUP", table)
    op = _reads_lookup()
    a = torch.randn(6)
    table.set_(torch.zeros(2, 2))  # the same tensor, reshaped in place to 2-D
    with pytest.raises(KernelLaunchError, match=r"reads the global 'LOOKUP', which was a float32, 1-D, contiguous array "
                                                r"when the kernel was defined and is now float32, 2-D, contiguous"):
        op(a)
    monkeypatch.setattr(this, "LOOKUP", torch.zeros(4, device="meta"))
    with pytest.raises(ArgumentTypeError, match=r"reads the global 'LOOKUP', a tensor on meta, but this call's "
                                                r"tensors are on cpu; .*hidden argument, never copied"):
        _reads_lookup()(a)


def test_device_arrays_are_refused_where_they_cannot_be_passed(fresh_cache, tmp_path):
    table = torch.zeros(3)

    @cuda.jit(device=True)
    def reads_table(i):
        return table[i]

    def through_device_function(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = reads_table(i % 3)

    with pytest.raises(KernelDefinitionError, match=r"its device function .*reads_table' reads the device array "
                                                    r"'table' as a global.*Pass 'table' to the device function"):
        make_definition(through_device_function, n_threads="a.numel()")

    holder = _load_module(tmp_path, "pnex_tensor_holder", "import torch\nTABLE = torch.zeros(3)\n")

    def module_attribute(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = holder.TABLE[i % 3]

    with pytest.raises(KernelDefinitionError, match=r"reads pnex_tensor_holder.TABLE, a device array, as a module "
                                                    r"attribute.*TABLE = pnex_tensor_holder.TABLE"):
        make_definition(module_attribute, n_threads="a.numel()")

    pair = (torch.zeros(3), 1.0)

    def in_a_tuple(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = pair[0][i % 3]

    with pytest.raises(KernelDefinitionError, match=r"the global 'pair' is a tuple holding a device array"):
        make_definition(in_a_tuple, n_threads="a.numel()")


def test_a_checked_launch_checks_a_hidden_argument_too(fresh_cache, monkeypatch):
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "LOOKUP", torch.arange(4.0))

    @pnex.jit(n_threads="a.numel()", check=True)
    def reads_past_lookup(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + LOOKUP[i]

    torch.testing.assert_close(reads_past_lookup(torch.ones(4)), torch.arange(4.0) + 1)
    with pytest.raises(KernelIndexError, match=r"index 4 is out of bounds for axis 0 of global device array 'LOOKUP' "
                                               r"\(shape \(4,\)\)"):
        reads_past_lookup(torch.ones(5))


def test_a_hidden_argument_works_under_torch_compile_and_opcheck(fresh_cache, monkeypatch):
    this = sys.modules[__name__]
    table = torch.randn(4)
    monkeypatch.setattr(this, "LOOKUP", table)
    op = _reads_lookup()
    assert op.definition.spec.schema == "(Tensor a) -> Tensor"  # not an argument of the op
    a = torch.randn(8)
    compiled = torch.compile(lambda x: op(x) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(a), (a + table.repeat(2)) * 2)
    table.add_(1.0)
    torch.testing.assert_close(compiled(a), (a + table.repeat(2)) * 2)
    torch.library.opcheck(op, (a,))


def test_saving_or_a_jax_gpu_call_of_a_kernel_with_hidden_arguments_is_refused(fresh_cache, monkeypatch, tmp_path):
    from pnex_magic.launch import xla

    this = sys.modules[__name__]
    monkeypatch.setattr(this, "LOOKUP", torch.randn(4))
    op = _reads_lookup()
    with pytest.raises(ArtifactError, match=r"cannot save 'reads_lookup': it reads the device array\(s\) 'LOOKUP' as "
                                            r"globals.*Make each a parameter"):
        pnex.save(op, tmp_path / "x.pnex")
    with pytest.raises(KernelDefinitionError, match=r"reads the device array\(s\) 'LOOKUP' as globals.*JAX "
                                                    r"computation on a GPU"):
        xla.kernel_id(op.definition)


def test_autotuning_restores_a_hidden_argument_the_kernel_writes(fresh_cache, monkeypatch):
    """Candidates run the kernel many times; one that writes a global device array must
    find it, and leave it, as the caller had it."""
    from pnex_magic.compiler import ResourceUsage

    counter = torch.zeros(3)

    def bumps(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = counter[0]
            counter[0] += 1

    d = make_definition(bumps, n_threads="a.numel()", threads_per_block=[64, 128, 256])
    seen = []

    def run(index):
        seen.append(counter.clone())
        counter.add_(5.0)  # what the candidate's launch does to it
        return [torch.zeros(3)]

    monkeypatch.setattr(autotune, "_device_facts", lambda index: ("Fake GPU", "sm_90"))
    monkeypatch.setattr(autotune, "_resources", lambda *a, **k: ResourceUsage(16, 0, 0, 0, 0, 0, 0, 0))
    monkeypatch.setattr(autotune, "_device_seconds", lambda call, device: (call(), 1e-6)[1])
    monkeypatch.delenv("PNEX_AUTOTUNE", raising=False)
    runner = autotune.Runner(run, lambda: None, lambda variant: (1024,), torch.device("cpu"))
    autotune.choose(d, device_index=0, layout="C", key=(1024,), capturing=False, runner=lambda: runner)
    assert len(seen) == 6 and all(torch.equal(s, torch.zeros(3)) for s in seen[0::2])  # each checked run
    assert torch.equal(counter, torch.zeros(3))  # as before tuning


def test_hidden_arguments_keep_their_order_and_line_numbers(fresh_cache):
    first, second = torch.randn(3), torch.randn(3, dtype=torch.float64)

    def two_globals(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + second[i % 3] * first[i % 3]

    d = make_definition(two_globals, n_threads="a.numel()")
    assert [h.name for h in d.hidden_arrays] == ["first", "second"]  # by name: a stable ABI
    fn = d.compile_function() if d.compiles else None
    if fn is not None:
        assert fn.__code__.co_varnames[:4] == ("a", "out", "first", "second")
        assert fn.__code__.co_firstlineno == two_globals.__code__.co_firstlineno
    a = torch.randn(7)
    expected = (a.double() + (second * first.double()).repeat(3)[:7]).float()
    torch.testing.assert_close(pnex.jit(n_threads="a.numel()")(two_globals)(a), expected)


def test_a_kernel_without_source_reading_a_device_array_says_so(fresh_cache):
    namespace = {"pnex": pnex, "cuda": cuda, "TABLE": torch.zeros(2)}
    exec(textwrap.dedent('''
        def no_source(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = TABLE[0]
    '''), namespace)
    d = make_definition(namespace["no_source"], n_threads="a.numel()")
    with pytest.raises(KernelDefinitionError, match=r"device array\(s\) TABLE as arguments.*no source here|"
                                                    r"device array\(s\) TABLE as arguments.*there is none here"):
        d.simulated_function()


def test_jax_on_cpu_runs_a_kernel_with_a_hidden_argument_in_the_simulator(fresh_cache, monkeypatch):
    jnp = pytest.importorskip("jax.numpy")
    import jax

    this = sys.modules[__name__]
    table = torch.randn(4)
    monkeypatch.setattr(this, "LOOKUP", table)
    f = pnex.jax_op(_reads_lookup())
    x = jnp.arange(6, dtype=jnp.float32)
    expected = torch.arange(6, dtype=torch.float32) + table.repeat(2)[:6]
    torch.testing.assert_close(torch.from_numpy(np.asarray(f(x))), expected)
    table.mul_(2.0)
    expected = torch.arange(6, dtype=torch.float32) + table.repeat(2)[:6]
    torch.testing.assert_close(torch.from_numpy(np.asarray(jax.jit(f)(x))), expected)
