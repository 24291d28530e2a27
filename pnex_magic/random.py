"""Random numbers inside kernels: a counter-based generator, Philox4x32-10.

Each number is a pure function of a 64-bit *seed* and a 64-bit *offset* (typically
the element's index), as ``tl.rand(seed, offset)`` is in Triton and as PyTorch's
CUDA generator draws them: no state to keep, any thread may draw any number, and
the same (seed, offset) gives the same bits in the CUDA simulator and on the GPU.
Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11;
the Random123 library) maps a 128-bit counter and a 64-bit key to 128 random bits;
here the key is the seed and the counter is ``(offset low 32 bits, offset high 32
bits, 0, 0)`` (:func:`randint4x`; :func:`philox` takes the four counter words).

The seed comes from a ``Seed`` parameter (:class:`pnex_magic.Seed`)::

    @pnex.jit(n_threads="x.numel()")
    def dropout(x: pnex.In("f32", (None,)), p: float, out: pnex.Out("f32", "x"), seed: pnex.Seed):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] / (1 - p) if pnex.random.uniform(seed, i) >= p else 0.0

Each call draws the seed from PyTorch's default generator of the op's device, so
``torch.manual_seed`` makes runs reproducible and every call (every replay of a CUDA
graph that captured it) draws new numbers; a kernel may also take its seed as an
integer argument (``seed: "u64"``) or a constant.  Draws from one seed are independent
for distinct offsets: give every number a kernel draws its own offset (``i``, or
``i * k + j`` for the j-th of k numbers per element), or use the four numbers of one
block (:func:`randint4x`, :func:`uniform4`, :func:`normal4`).

What a kernel calls (``seed``: the ``Seed`` array, or an integer; ``offset``: an
integer):

* :func:`randint4x`, :func:`randint`: uint32 words;
* :func:`uniform` (float32 in [0, 1), 24 random bits: every value a multiple of 2**-24,
  never 1.0), :func:`uniform4`, :func:`uniform_f64` (float64 in [0, 1), 53 bits);
* :func:`normal` (float32, Box-Muller on two words), :func:`normal4`,
  :func:`normal_f64` (float64, on all four).

Integers and uniforms are bit-identical on CPU and GPU; normals go through ``log``,
``sqrt`` and ``cos``/``sin``, which the GPU computes in float32 within a few units
in the last place (libdevice) and the simulator in float64, so they agree to about
1e-6 relative.  Host helpers: :func:`draw_seed` (what a call draws) and
:func:`xoroshiro128p_states` (the states Numba's ``xoroshiro128p_*`` functions take).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

__all__ = [
    "philox",
    "randint4x",
    "randint",
    "uniform",
    "uniform4",
    "uniform_f64",
    "normal",
    "normal4",
    "normal_f64",
    "draw_seed",
    "xoroshiro128p_states",
    "register_cuda",
]

# Philox4x32's multipliers and Weyl key increments (Random123, philox.h).
_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_LOW = np.uint64(0xFFFFFFFF)
_S8 = np.uint64(8)
_S11 = np.uint64(11)
_S21 = np.uint64(21)
_S32 = np.uint64(32)
_ONE = np.uint64(1)
_F32_UNIT = np.float32(2.0**-24)
_F64_UNIT = np.float64(2.0**-53)
_F32_TWO_PI = np.float32(2 * math.pi)
_F32_MINUS_TWO = np.float32(-2.0)
_F64_TWO_PI = np.float64(2 * math.pi)

_MASK64 = 0xFFFFFFFFFFFFFFFF


# Two helpers whose Python forms (what the simulator runs) and CUDA forms (register_cuda)
# differ: Python must wrap negative integers itself, and reads an array's element.
def _word(x: Any) -> np.uint64:
    """An integer as a uint64 word (two's complement for negative values)."""
    return np.uint64(int(x) & _MASK64)


def _seed_word(seed: Any) -> np.uint64:
    """The seed as a uint64 word: an integer, or element 0 of a ``Seed`` array."""
    if not isinstance(seed, (int, np.integer)):  # a Seed array (in the simulator: numba's fake array)
        seed = seed[0]
    return _word(seed)


def philox(seed, c0, c1, c2, c3):
    """Philox4x32-10 of the counter ``(c0, c1, c2, c3)`` (32-bit words) with the key
    ``(seed's low 32 bits, seed's high 32 bits)``: four uint32 words."""
    key = _seed_word(seed)
    k0 = key & _LOW
    k1 = key >> _S32
    x0 = _word(c0) & _LOW
    x1 = _word(c1) & _LOW
    x2 = _word(c2) & _LOW
    x3 = _word(c3) & _LOW
    for _ in range(10):
        p0 = _M0 * x0
        p1 = _M1 * x2
        x0, x1, x2, x3 = (p1 >> _S32) ^ x1 ^ k0, p1 & _LOW, (p0 >> _S32) ^ x3 ^ k1, p0 & _LOW
        k0 = (k0 + _W0) & _LOW
        k1 = (k1 + _W1) & _LOW
    return np.uint32(x0), np.uint32(x1), np.uint32(x2), np.uint32(x3)


def randint4x(seed, offset):
    """Four random uint32 words for ``(seed, offset)``: Philox4x32-10 of the counter
    ``(offset low, offset high, 0, 0)``."""
    word = _word(offset)
    return philox(seed, word & _LOW, word >> _S32, 0, 0)


def randint(seed, offset):
    """One random uint32 word: the first of :func:`randint4x`."""
    return randint4x(seed, offset)[0]


def _unit24(x):
    """A uint32 word as a float32 in [0, 1): its 24 high bits times 2**-24."""
    return np.float32(np.uint64(x) >> _S8) * _F32_UNIT


def _unit53(lo, hi):
    """Two uint32 words as a float64 in [0, 1): 53 bits times 2**-53."""
    return np.float64((np.uint64(hi) << _S21) | (np.uint64(lo) >> _S11)) * _F64_UNIT


def uniform(seed, offset):
    """A float32 uniform in [0, 1) (24 random bits)."""
    return _unit24(randint(seed, offset))


def uniform4(seed, offset):
    """Four float32 uniforms in [0, 1), from one Philox block."""
    a, b, c, d = randint4x(seed, offset)
    return _unit24(a), _unit24(b), _unit24(c), _unit24(d)


def uniform_f64(seed, offset):
    """A float64 uniform in [0, 1) (53 random bits, from two words)."""
    a, b, _, _ = randint4x(seed, offset)
    return _unit53(a, b)


def _box_muller32(a, b):
    """Two standard normals (float32) from two uint32 words (Box-Muller)."""
    u1 = np.float32((np.uint64(a) >> _S8) + _ONE) * _F32_UNIT  # (0, 1]: log is finite
    u2 = _unit24(b)
    r = np.float32(math.sqrt(_F32_MINUS_TWO * math.log(u1)))
    theta = _F32_TWO_PI * u2
    return np.float32(r * math.cos(theta)), np.float32(r * math.sin(theta))


def normal(seed, offset):
    """A float32 standard normal (Box-Muller on the first two words)."""
    a, b, _, _ = randint4x(seed, offset)
    return _box_muller32(a, b)[0]


def normal4(seed, offset):
    """Four float32 standard normals, from one Philox block."""
    a, b, c, d = randint4x(seed, offset)
    z0, z1 = _box_muller32(a, b)
    z2, z3 = _box_muller32(c, d)
    return z0, z1, z2, z3


def normal_f64(seed, offset):
    """A float64 standard normal (Box-Muller on 53-bit uniforms from all four words)."""
    a, b, c, d = randint4x(seed, offset)
    u1 = np.float64(((np.uint64(b) << _S21) | (np.uint64(a) >> _S11)) + _ONE) * _F64_UNIT  # (0, 1]
    u2 = _unit53(c, d)
    return np.float64(math.sqrt(-2.0 * math.log(u1)) * math.cos(_F64_TWO_PI * u2))


_KERNEL_FUNCTIONS = (philox, randint4x, randint, _unit24, _unit53, uniform, uniform4, uniform_f64, _box_muller32,
                     normal, normal4, normal_f64)


@functools.lru_cache(maxsize=1)
def register_cuda() -> None:
    """Make the functions above callable from CUDA kernels (once; the compile stage
    calls it before it compiles a kernel): the same Python code, compiled by Numba,
    and CUDA forms of the two helpers that read the seed and wrap integers."""
    from numba.cuda import types
    from numba.cuda.core.errors import TypingError
    from numba.cuda.extending import overload, register_jitable

    @overload(_word, target="cuda")
    def _word_impl(x):
        if isinstance(x, (types.Integer, types.Boolean)):
            return lambda x: np.uint64(x)
        raise TypingError(f"pnex.random: offsets and counter words are integers, got {x}")

    @overload(_seed_word, target="cuda")
    def _seed_word_impl(seed):
        if isinstance(seed, types.Array) and isinstance(seed.dtype, types.Integer) and seed.ndim == 1:
            return lambda seed: np.uint64(seed[0])
        if isinstance(seed, types.Integer):
            return lambda seed: np.uint64(seed)
        raise TypingError(
            f"pnex.random: the seed is a Seed parameter (a one-element integer array) or an integer, got {seed}"
        )

    for fn in _KERNEL_FUNCTIONS:
        register_jitable(fn)


# ---------------------------------------------------------------------------- host side


def draw_seed(device: torch.device | str) -> torch.Tensor:
    """What each call of an op draws for a ``Seed`` parameter: a one-element int64
    tensor on ``device`` holding 64 random bits from PyTorch's default generator of that
    device (the kernel reads them as uint64).  One ``random_()``: on a GPU a tiny kernel,
    which a CUDA graph replays with a new value each time (torch's generator keeps its
    offset in device memory under capture)."""
    return torch.empty(1, dtype=torch.int64, device=device).random_(-(2**63), None)


def xoroshiro128p_states(
    n: int, seed: int, device: torch.device | str = "cpu", subsequence_start: int = 0
) -> torch.Tensor:
    """``n`` xoroshiro128+ generator states, as Numba's ``create_xoroshiro128p_states(n,
    seed, subsequence_start)`` makes them (the same streams: state ``i`` is the seeded
    state jumped ``subsequence_start + i`` times by 2**64 steps), as a ``(n, 2)`` uint64
    tensor on ``device``: what a kernel parameter ``InMut("xoroshiro128p", (None,))``
    takes and Numba's ``xoroshiro128p_uniform_float32(states, i)`` and friends advance in
    place.  Made on the CPU by Numba's own initialiser, then copied to ``device``."""
    from numba.cuda.random import init_xoroshiro128p_states_cpu, xoroshiro128p_dtype

    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"xoroshiro128p_states: n must be a non-negative int, got {n!r}")
    states = np.empty(n, dtype=xoroshiro128p_dtype)
    init_xoroshiro128p_states_cpu(states, seed, subsequence_start)
    return torch.from_numpy(states.view(np.uint64).reshape(n, 2).copy()).to(device)
