"""Accesses the checked variant proves in bounds from the kernel's source
(:mod:`pnex_magic.checking.index_ranges`), without a GPU.

* the diffusion stencil's shared and local accesses are proven, its global ones not;
* every unsound shortcut is refused: an off-by-one, an unknown block, a subtraction
  that may go negative (unsigned wrap-around on the GPU), a name rebound in a loop,
  a parameter, a rebound array, a shadowed ``range``, a non-integer global;
* a randomised check: for hundreds of generated index expressions, whenever the
  analysis proves one, evaluating it for every thread and loop trip gives an index
  in bounds and no negative or overflowing intermediate value;
* the simulator still catches a planted bug beside proven accesses, and a checked
  kernel whose accesses are all proven gives the fast kernel's results.

Tensor parameters' accesses under guards: tests/test_index_ranges_guards.py.
"""

from __future__ import annotations

import ast
import itertools
import random
import textwrap
import types

import numpy as np
import pytest
from numba import cuda, float32, int32

import pnex_magic as pnex
from pnex_magic import checking as C
from pnex_magic.checking import IndexRanges, Interval
from pnex_magic.lazycuda import cuda as lazy_cuda
from toolchain import simulate


TX, TY, R = 32, 8, 4
HALO = (TY * R + 2, TX + 2)
RATE = 0.5  # a float global: never a constant index


def stencil(u, out):
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * TX + tx
    top = cuda.blockIdx.y * TY * R
    mine = cuda.local.array(R, float32)
    for k in range(R):
        row = top + ty + k * TY
        mine[k] = u[row, col] if row < u.shape[0] and col < u.shape[1] else 0.0
    h = ty * TX + tx
    hr = 0 if h < TX else TY * R + 1
    hc = h % TX + 1
    tile = cuda.shared.array(shape=HALO, dtype=float32)
    for k in range(R):
        tile[ty + k * TY + 1, tx + 1] = mine[k]
    tile[hr, hc] = 0.0
    cuda.syncthreads()
    for k in range(R):
        r = ty + k * TY + 1
        row = top + r - 1
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = tile[r - 1, tx + 1] + tile[r + 1, tx + 1] + tile[r, tx] + tile[r, tx + 2]


def _blocks(blocks):
    """A spec that says only which block shapes the op launches with."""
    return types.SimpleNamespace(block_candidates=tuple(blocks), params=())


def _fdef(fn):
    import inspect

    return ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]


def _subscripts(fdef, name):
    return [n for n in ast.walk(fdef) if isinstance(n, ast.Subscript) and getattr(n.value, "id", None) == name]


def test_the_stencils_on_chip_accesses_are_proven_and_its_global_ones_checked():
    ck = C.checked_kernel(stencil, _blocks([(TX, TY)]))
    assert {s.variable for s in ck.proven} == {"tile", "mine"}
    assert len(ck.proven) == 2 + 1 + 1 + 4  # mine[k] twice; tile: 2 stores, 4 loads
    assert {s.variable for s in ck.sites} == {"u", "out"}
    assert {s.role for s in ck.proven} == {"shared array", "local array"}
    # Left as written in the checked function: no on-chip helper is called.
    names = set(ck.function.__code__.co_names)
    assert {"__pnex_load", "__pnex_store"} <= names and "__pnex_load_on_chip" not in names
    unproven = C.checked_kernel(stencil).function.__code__.co_names
    assert "__pnex_load_on_chip" in unproven


def test_without_the_block_shape_the_thread_index_is_unbounded():
    ck = C.checked_kernel(stencil)  # no blocks: threadIdx.x may be up to 1023
    assert sum(s.variable == "tile" for s in ck.sites) == 5  # the stores of mine[k] and the 4 loads
    # mine[k] (k < R) and tile[hr, hc] (each a modulo or a constant) need no block:
    assert [(s.variable, s.kind) for s in ck.proven] == [("mine", "store"), ("mine", "load"), ("tile", "store")]
    assert ck.proven[-1].source_text == "tile[hr, hc] = 0.0"


def test_an_autotuned_op_is_proven_against_its_largest_block():
    assert C.checked_kernel(stencil, _blocks([(TX, TY), (TX, TY // 2)])).sites == C.checked_kernel(stencil, _blocks([(TX, TY)])).sites
    assert any(s.variable == "tile" for s in C.checked_kernel(stencil, _blocks([(TX, TY), (TX * 2, TY)])).sites)


def _ranges(source, blocks=((32, 8),), **names):
    fdef = ast.parse(textwrap.dedent(source)).body[0]
    return fdef, IndexRanges(fdef, {"cuda": lazy_cuda, "float32": float32, **names}, blocks)


def _proven(source, blocks=((32, 8),), **names):
    fdef, ranges = _ranges(source, blocks, **names)
    return [ranges.in_bounds(s) for s in _subscripts(fdef, "t")]


@pytest.mark.parametrize("why, source, expected", [
    ("in bounds", "def k(a):\n t = cuda.shared.array(32, float32)\n t[cuda.threadIdx.x] = 0", [True]),
    ("off by one", "def k(a):\n t = cuda.shared.array(32, float32)\n t[cuda.threadIdx.x + 1] = 0", [False]),
    ("may go negative", "def k(a):\n t = cuda.shared.array(64, float32)\n x = cuda.threadIdx.x\n"
     " t[x - 1] = 0\n t[(x - cuda.threadIdx.y) // 2 + 8] = 0", [False, False]),
    ("rebound in a loop", "def k(a):\n t = cuda.shared.array(32, float32)\n i = 0\n while i < 32:\n"
     "  t[i] = 0\n  i += 1", [False]),
    ("a parameter", "def k(a, n):\n t = cuda.shared.array(32, float32)\n t[n % 32] = 0\n t[n] = 0", [True, False]),
    ("unpacked from a call", "def k(a):\n t = cuda.shared.array(32, float32)\n i, j = cuda.grid(2)\n t[i] = 0",
     [False]),
    ("two arrays, one name", "def k(a):\n t = cuda.shared.array(32, float32)\n t = cuda.local.array(2, float32)\n"
     " t[1] = 0", [False]),
    ("range shadowed", "def k(a):\n range = max\n t = cuda.shared.array(32, float32)\n for i in range(4):\n"
     "  t[i] = 0", [False]),
    ("a float global", "def k(a):\n t = cuda.shared.array(32, float32)\n t[int(RATE)] = 0", [False]),
    ("a mask", "def k(a):\n t = cuda.shared.array(32, float32)\n t[cuda.grid(1) & 31] = 0\n"
     " t[cuda.grid(1) & 32] = 0", [True, False]),
    ("a view", "def k(a):\n t = cuda.shared.array((4, 4), float32)\n x = t[1]\n t[1, 2] = 0", [False, True]),
    ("a walrus", "def k(a):\n t = cuda.shared.array(32, float32)\n i = 1\n if (i := a[0]):\n  pass\n t[i] = 0",
     [False]),
    ("blockDim", "def k(a):\n t = cuda.shared.array(32, float32)\n t[cuda.blockDim.x - 1] = 0\n"
     " t[cuda.blockDim.x] = 0", [True, False]),
    ("every binding counts", "def k(a):\n t = cuda.shared.array(32, float32)\n i = 40\n if a[0] > 0:\n"
     "  i = 3\n t[i] = 0\n j = 3\n if a[0] > 0:\n  j = 31\n t[j] = 0", [False, True]),
])
def test_what_is_proven_and_what_is_not(why, source, expected):
    assert _proven(source, RATE=RATE) == expected, why


def test_the_cuda_module_is_recognised_however_it_is_named():
    import numba

    from numba.cuda import threadIdx

    body = "def k(a):\n t = cuda.shared.array(32, float32)\n t[{}] = 0"
    assert _proven(body.format("cuda.threadIdx.x"), cuda=cuda) == [True]  # numba.cuda itself
    assert _proven(body.format("threadIdx.x"), threadIdx=threadIdx) == [True]
    assert _proven(body.format("numba.cuda.threadIdx.x"), numba=numba) == [True]
    assert _proven(body.format("numba.cuda"), numba=numba) == [False]  # no attribute left: not an index
    assert _proven(body.format("cuda.threadIdx.x"), cuda=np) == [False]  # some other "cuda"
    assert _proven(body.format("cuda.threadIdx.x"), blocks=None) == [False]


# ------------------------------------------------------------------ randomised soundness


_ATOMS = ("tx", "ty", "k", "C", "0", "1", "3", "7", "32")


def _expr(rng, depth):
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(_ATOMS)
    kind = rng.random()
    a, b = _expr(rng, depth - 1), _expr(rng, depth - 1)
    if kind < 0.7:
        return f"({a} {rng.choice(['+', '-', '*', '//', '%', '&', '>>', '<<', '|'])} {b})"
    if kind < 0.8:
        return f"{rng.choice(['min', 'max'])}({a}, {b})"
    if kind < 0.9:
        return f"({a} if tx < {b} else {_expr(rng, depth - 1)})"
    return f"int({a})"


def _evaluate(node, env, seen):
    """The value of ``node`` as a kernel computes it (Python's floor division and
    modulo; a division by zero gives 0, as Numba's CUDA target does), and each
    sub-expression's value appended to ``seen`` as (node, value)."""
    if isinstance(node, ast.Constant):
        value = node.value
    elif isinstance(node, ast.Name):
        value = env[node.id]
    elif isinstance(node, ast.BinOp):
        a, b = _evaluate(node.left, env, seen), _evaluate(node.right, env, seen)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b if b else 0, ast.Mod: lambda: a % b if b else 0,
               ast.BitAnd: lambda: a & b, ast.RShift: lambda: a >> b if b >= 0 else 0,
               ast.LShift: lambda: a << b if 0 <= b < 64 else 0, ast.BitOr: lambda: a | b}
        value = ops[type(node.op)]()
    elif isinstance(node, ast.IfExp):
        test = _evaluate(node.test.left, env, seen) < _evaluate(node.test.comparators[0], env, seen)
        value = _evaluate(node.body if test else node.orelse, env, seen)
    elif isinstance(node, ast.Call):
        args = [_evaluate(a, env, seen) for a in node.args]
        value = {"min": min, "max": max, "int": int}[node.func.id](*args)
    else:
        raise AssertionError(ast.dump(node))
    seen.append((node, value))
    return value


def test_whatever_is_proven_is_in_bounds_for_every_thread_and_trip():
    rng = random.Random(20261124)
    size, const, trips = 40, 5, 3
    proven = 0
    for _ in range(600):
        text = _expr(rng, 3)
        source = (f"def k(a):\n t = cuda.shared.array({size}, float32)\n tx = cuda.threadIdx.x\n"
                  f" ty = cuda.threadIdx.y\n for k in range({trips}):\n  t[{text}] = 0\n")
        fdef, ranges = _ranges(source, blocks=((8, 4),), C=const)
        (access,) = _subscripts(fdef, "t")
        if not ranges.in_bounds(access):
            continue
        proven += 1
        for tx, ty, k in itertools.product(range(8), range(4), range(trips)):
            seen: list = []
            index = _evaluate(access.slice, {"tx": tx, "ty": ty, "k": k, "C": const}, seen)
            assert 0 <= index < size, (text, tx, ty, k, index)
            # Every sub-expression with a known interval lies in it (and so in [0, 2**31):
            # no wrap-around or overflow where the proof relies on the value).
            for node, value in seen:
                known = ranges.interval(node)
                assert known is None or known.lo <= value <= known.hi < 2**31, (text, ast.unparse(node), value, known)
    assert proven >= 60, proven  # the analysis proves a fair share, not nothing


def test_interval_union():
    assert (Interval(0, 3) | Interval(5, 9)) == Interval(0, 9)


# ------------------------------------------------------------------ in the simulator


def tile_sum(a, out):
    tile = cuda.shared.array(16, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = a[i] if i < a.shape[0] else 0.0
    cuda.syncthreads()
    if i < out.shape[0]:
        out[i] = tile[t] + tile[(t + 1) % 16] + tile[15 - t]


def tile_off_by_one(a, out):
    tile = cuda.shared.array(16, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = a[i]
    cuda.syncthreads()
    out[i] = tile[t] + tile[t + 1]  # the last thread reads past the tile


def test_a_kernel_with_every_tile_access_proven_gives_the_right_result():
    ck = C.checked_kernel(tile_sum, _blocks([(16,)]))
    assert [s.variable for s in ck.proven] == ["tile"] * 4 and {s.variable for s in ck.sites} == {"a", "out"}
    a = np.random.default_rng().random(48).astype(np.float32)
    out = np.full(48, np.nan, np.float32)
    err = simulate(ck.function, 3, 16, a, out)
    assert err[C.FLAG] == 0
    tiles = a.reshape(3, 16).astype(np.float64)
    expected = tiles + np.roll(tiles, -1, axis=1) + tiles[:, ::-1]
    np.testing.assert_allclose(out, expected.ravel(), rtol=1e-6, atol=1e-6)


def test_a_bug_beside_proven_accesses_is_still_caught():
    ck = C.checked_kernel(tile_off_by_one, _blocks([(16,)]))
    assert [s.source_text for s in ck.proven] == ["tile[t] = a[i]", "out[i] = tile[t] + tile[t + 1]  # the last thread reads past the tile"]
    a = np.ones(16, np.float32)
    err = simulate(ck.function, 1, 16, a, np.zeros(16, np.float32))
    message = ck.describe(err)
    assert message is not None and "tile" in message and "16" in message
    assert ck.sites[int(err[C.SITE_SLOT])].source_text.startswith("out[i] = tile[t] + tile[t + 1]")


def test_the_reports_checked_run_says_what_was_tested_and_what_was_proven():
    import torch

    from pnex_magic import report

    @pnex.jit(n_threads="a.numel()", threads_per_block=16)
    def mirrored(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        tile = cuda.shared.array(16, float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        tile[t] = a[i] if i < a.shape[0] else 0.0
        cuda.syncthreads()
        if i < a.shape[0]:
            out[i] = tile[15 - t] + a[0]  # a[0]: a may be empty, so it is tested

    note = report._run_checked(mirrored, (torch.rand(32),), "args")  # CPU tensors: the simulator
    assert note.startswith("a checked run on args found no access out of bounds (1 access tested, "
                           "4 more proven in bounds from the source; "), note
    assert report._checked_accesses(all_proven) == "all 5 accesses proven in bounds from the source, none left to test"


@pnex.jit(n_threads="a.numel()", threads_per_block=16)
def all_proven(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    tile = cuda.shared.array(16, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = a[i] if i < a.shape[0] else 0.0
    cuda.syncthreads()
    if i < a.shape[0]:
        out[i] = tile[15 - t] + a[i]


def histogram(x, counts):
    bins = cuda.shared.array(64, int32)
    t = cuda.threadIdx.x
    bins[t] = 0
    cuda.syncthreads()
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.add(bins, x[i] % 64, 1)  # Python's modulo: 0 to 63 whatever x[i] is
        cuda.atomic.add(bins, x[i] % 65 - 1, 0)  # may be -1: checked
    cuda.syncthreads()
    cuda.atomic.add(counts, t, bins[t])


def test_a_shared_histograms_atomic_is_proven_and_counts_right():
    ck = C.checked_kernel(histogram, _blocks([(64,)]))
    assert [(s.variable, s.kind) for s in ck.proven] == [("bins", "store"), ("bins", "atomic"), ("bins", "load")]
    assert sorted((s.variable, s.kind) for s in ck.sites) == [("bins", "atomic"), ("counts", "atomic"),
                                                              ("x", "load"), ("x", "load")]
    x = np.random.default_rng().integers(-1000, 1000, 4 * 64).astype(np.int64)
    counts = np.zeros(64, np.int32)
    err = simulate(ck.function, 4, 64, x, counts)
    assert err[C.FLAG] == 0
    np.testing.assert_array_equal(counts, np.bincount(x % 64, minlength=64))
