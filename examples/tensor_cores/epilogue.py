"""What the fused bias + GELU epilogues of the Hopper GEMMs share (:mod:`gemm_wgmma`'s
``cp.async`` kernel and :mod:`gemm_tma`'s TMA one): the exact GELU, the layout of the
float32 tile they stage their accumulators in, and the check that this tile fits the
tile buffers it reuses.

Both epilogues work the same way: the threads that hold the accumulators copy them as
they are, float32, into the shared memory the k-loop's tile buffers no longer need,
with a straight ``for j in range(BN // 8)`` loop (its body small enough to be unrolled,
so the accumulators stay in registers), and the GELU is applied in the store loop that
follows (:func:`gelu_store`), to 8 values a thread, packed to 16 bytes of C.

The persistent kernels (:mod:`gemm_tma`'s ``make_linear_persistent`` and :mod:`gemm_pingpong`)
apply bias and GELU to the accumulators in registers instead, and stage C in its own dtype
``CHUNK`` columns at a time through the two halves of a buffer (:func:`make_stage_chunk_f16`,
:func:`store_staged16`, one named barrier a chunk: :func:`make_chunk16`): no float32 tile,
half the shared stores.
"""

import math

from numba import cuda, float32

import pnex_magic as pnex
from pnex_magic import tc

SQRT1_2 = 0.7071067811865476
GELU_WIDTHS = (32, 64, 128, 256)  # the BN the float32 staging takes


@cuda.jit(device=True, inline=True)
def gelu(x):
    """The exact GELU, ``torch.nn.functional.gelu``'s default: ``x/2 (1 + erf(x/√2))``, in float32."""
    return float32(0.5) * x * (float32(1.0) + math.erf(x * float32(SQRT1_2)))


#: log2(Phi(-a)) + a^2 log2(e) / 2 (Phi the standard normal CDF, a = |x|) on [0, GELU_CLAMP], a
#: polynomial of degree 7 (a weighted least-squares fit; constant term first): at most 4.7e-6
#: off in log2, so Phi's relative error stays within 6.4e-6 (float32 evaluation, checked).
PHI_LOG2_COEFFS = (-0.9999952939353552, -1.1512511203559954, 0.26288336473975144, -0.05396032116131084,
                   0.00850801250232857, -0.0009305540661840773, 6.160169587437312e-05, -1.8349641347764092e-06)
GELU_CLAMP = 6.0  # beyond: |gelu(x)| < 6e-9 |x| for x < 0, and gelu(x) = x to float32 for x > 0
HALF_L2E = 0.7213475204444817  # log2(e) / 2


@cuda.jit(device=True, inline=True)
def gelu_poly(x):
    """The exact GELU ``x Phi(x)`` with ``q = Phi(-|x|) = exp2(P(|x|) - x^2 log2(e) / 2)``
    (:data:`PHI_LOG2_COEFFS`) and ``x Phi(x) = max(x, 0) - |x| q`` for either sign (one max
    and one fused multiply-add, no compare and select): 9 fused multiply-adds and one
    ``tc.exp2_approx`` (one ``MUFU.EX2``) a value, no branch: about 18 instructions a value
    in the store loop against 30 for :func:`gelu`'s libdevice ``erff`` (which evaluates two
    ranges' polynomials and selects).  Relative error within 7e-6 for x >= -6 (float32
    arithmetic, the fit's 6.4e-6 and exp2's approximation: well under float16's and
    bfloat16's rounding), where the erf form's ``1 + erf`` cancels (torch's float32 GELU
    is 2e-4 off at x = -3 and wrong in every digit below x = -6; here |gelu(x)| < 6e-9 |x|).

    The max form (2026-11-29) has 24 fewer SASS instructions than ``x * (q if x < 0 else
    1 - q)`` in the persistent kernel's four store loops (3504 against 3528, sm_90a) and
    no time to show for it: the GELU cost 18.8 against 18.3 us over the plain product at
    4096^3 and 171.7 against 171.1 at 8192 x 16384 x 4096, timed interleaved on an H200
    (``benchmarks/results/epilogue-pairs-2026-11-29-0421.json``, its log beside)."""
    a = min(abs(x), float32(GELU_CLAMP))
    p = float32(PHI_LOG2_COEFFS[7])
    p = p * a + float32(PHI_LOG2_COEFFS[6])
    p = p * a + float32(PHI_LOG2_COEFFS[5])
    p = p * a + float32(PHI_LOG2_COEFFS[4])
    p = p * a + float32(PHI_LOG2_COEFFS[3])
    p = p * a + float32(PHI_LOG2_COEFFS[2])
    p = p * a + float32(PHI_LOG2_COEFFS[1])
    p = p * a + float32(PHI_LOG2_COEFFS[0])
    q = tc.exp2_approx(p - x * x * float32(HALF_L2E))  # Phi(-|x|): one MUFU.EX2, no subnormal handling
    return max(x, float32(0.0)) - a * q


@cuda.jit(device=True, inline=True)
def no_activation(x):
    """``x``: the bias-only epilogue, to measure what the GELU's arithmetic costs (about 30
    instructions a value: libdevice's ``erff`` evaluates both of its ranges' polynomials and
    selects; an ``erfc`` form, one division and one ``exp2`` a value, made the store loop a
    third longer in SASS, 2026-11-28)."""
    return x


#: The fused epilogues' activations by name (``activation=`` of the GEMM makers).
ACTIVATIONS = {"gelu": gelu, "gelu_poly": gelu_poly, "bias": no_activation}


@cuda.jit(device=True, inline=True)
def f32_unit(row, u):
    """Where 16-byte unit ``u`` (floats 4u to 4u + 3) of row ``row`` of the GELU
    epilogue's float32 tile is stored in the row: ``u ^ bit 3 of u ^ 2 * (row % 4)``;
    in rows 4-7 of every 8 the floats of a unit are also stored pairwise swapped
    (``(col % 4) ^ 1``).  So the 4-byte stores of the accumulators (a warp: 8 rows x 4
    pairs) fill the 32 banks once each, and so do the store loop's 16-byte loads (a
    quarter-warp: one row, the first or second halves of 8 consecutive 32-byte chunks).
    Shifts and masks, not // and %: no sign fix-ups in the addresses.  Rows of at least
    8 units (BN >= 32): the XOR stays in the row."""
    return u ^ ((u >> 3) & 1) ^ ((row & 3) << 1)


@cuda.jit(device=True, inline=True)
def stage_f32(stage, r, col, BN, x0, x1, x2, x3):
    """Four accumulators of a thread into the float32 tile ``stage`` (rows ``BN`` wide,
    laid out by :func:`f32_unit`): ``x0, x1`` at row ``r``, columns ``col, col + 1``, and
    ``x2, x3`` at row ``r + 8``, the same columns.  4-byte stores: a vector store would
    keep its alignment test.  The caller's loop over its accumulators stays straight
    (``for j in range(BN // 8)``): this body is small enough to be unrolled."""
    i = r * BN + (f32_unit(r, col >> 2) << 2) + ((col & 3) ^ ((r >> 2) & 1))
    stage[i] = x0
    stage[i ^ 1] = x1
    i += 8 * BN  # row r + 8: the same unit, the same swap
    stage[i] = x2
    stage[i ^ 1] = x3


@cuda.jit(device=True, inline=True)
def pack(x, y, bf16):
    """Two float32 values as one 32-bit word of float16 (``bf16`` False) or bfloat16;
    ``bf16`` is a constant of the kernel, so the branch is folded away."""
    if bf16:
        return tc.pack_bf16x2(x, y)
    return tc.pack_f16x2(x, y)


@cuda.jit(device=True, inline=True)
def staged8(stage, row, col, BN):
    """Floats ``col`` to ``col + 7`` of row ``row`` of the float32 tile ``stage`` (rows
    ``BN`` wide, laid out by :func:`f32_unit`): two 16-byte loads, the pair swap of rows
    4-7 undone (``col`` a multiple of 8)."""
    x0, x1, x2, x3 = pnex.vload(stage, row * BN + (f32_unit(row, col >> 2) << 2), 4)
    x4, x5, x6, x7 = pnex.vload(stage, row * BN + (f32_unit(row, (col >> 2) + 1) << 2), 4)
    if row & 4:  # stored pairwise swapped
        return x1, x0, x3, x2, x5, x4, x7, x6
    return x0, x1, x2, x3, x4, x5, x6, x7


_STORES = {}


def activation_named(activation):
    """``ACTIVATIONS[activation]``, or a ValueError naming the choices."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation]


def activation_store(activation="gelu"):
    """The store loop of a fused epilogue whose activation is ``ACTIVATIONS[activation]``
    (a device function, made once a name): :func:`gelu_store` with another activation."""
    act = activation_named(activation)
    if activation not in _STORES:

        @cuda.jit(device=True, inline=True)
        def store(c, bias, stage, m0, n0, t, threads, rows, BN, bf16):
            """The store loop of a GELU epilogue: the ``rows`` x ``BN`` float32 tile ``stage``
            (laid out by :func:`f32_unit`) to C at ``(m0, n0)``, ``act(x + bias)``, by
            ``threads`` threads of which this is number ``t``: 16-byte chunks, consecutive along
            rows.  BN / 8 divides ``threads`` (:func:`gelu_fits`), so a thread always stores the
            same 8 columns and loads their bias once; its rows are ``t // (BN / 8)`` and every
            ``threads // (BN / 8)`` after it.  Where that step is a multiple of 8 a thread's
            ``row % 8`` is fixed; otherwise (4 rows a step: 128 threads at BN = 256) ``row & 4``
            alternates and the pair swap of rows 4-7 is taken per chunk, as it is here."""
            per = BN // 8  # chunks a row
            col = (t % per) * 8
            b0 = float32(bias[n0 + col])
            b1 = float32(bias[n0 + col + 1])
            b2 = float32(bias[n0 + col + 2])
            b3 = float32(bias[n0 + col + 3])
            b4 = float32(bias[n0 + col + 4])
            b5 = float32(bias[n0 + col + 5])
            b6 = float32(bias[n0 + col + 6])
            b7 = float32(bias[n0 + col + 7])
            for q in range(rows * BN // 8 // threads):
                row = t // per + q * (threads // per)
                x0, x1, x2, x3, x4, x5, x6, x7 = staged8(stage, row, col, BN)
                tc.store_words(c, (m0 + row, n0 + col),
                               (pack(act(x0 + b0), act(x1 + b1), bf16), pack(act(x2 + b2), act(x3 + b3), bf16),
                                pack(act(x4 + b4), act(x5 + b5), bf16), pack(act(x6 + b6), act(x7 + b7), bf16)))

        _STORES[activation] = store
    return _STORES[activation]


gelu_store = activation_store("gelu")


CHUNK = 64  # the persistent kernels stage C 64 columns at a time, through two halves of a buffer


def make_stage_chunk_f16(act, gelu, bf16, rows):
    """The persistent kernels' staging of one chunk: columns ``chunk * CHUNK`` to ``chunk *
    CHUNK + CHUNK - 1`` of a warpgroup thread's accumulators ``acc`` (a ``wgmma``
    m64nN's: rows ``r`` and ``r + 8``, its pairs at ``col``, ``col + 1`` of every 8;
    ``chunk`` a constant at the call, so that ``acc``'s indices stay constants),
    ``act(x + bias)`` applied in registers (``gelu``; the bias of the chunk's columns read
    from the shared float32 row ``sbias`` from ``bias0``), packed to float16 (bfloat16)
    pairs into the ``rows`` x ``CHUNK`` half ``half`` of ``stage16`` (32-bit words, two
    halves of ``rows`` rows of 128 bytes each, in the 128-byte swizzle: a warp's 4-byte
    stores, 8 rows x 4 words, fill the 32 banks once).  ``rows``: a multiple of 8 (the
    swizzle sees a row's place in its 8)."""

    @cuda.jit(device=True, inline=True)
    def stage(stage16, half, sbias, bias0, acc, chunk, r, col):
        for jj in range(CHUNK // 8):  # a constant trip count: unrolled, the accumulators stay in registers
            j = chunk * (CHUNK // 8) + jj
            x0, x1, x2, x3 = acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]
            if gelu:
                b0 = sbias[bias0 + jj * 8 + col]
                b1 = sbias[bias0 + jj * 8 + col + 1]
                x0, x1, x2, x3 = act(x0 + b0), act(x1 + b1), act(x2 + b0), act(x3 + b1)
            row = half * rows + r
            stage16[row * (CHUNK // 2) + (tc.swizzle(row, jj * 8 + col, CHUNK) >> 1)] = pack(x0, x1, bf16)
            row += 8
            stage16[row * (CHUNK // 2) + (tc.swizzle(row, jj * 8 + col, CHUNK) >> 1)] = pack(x2, x3, bf16)

    return stage


@cuda.jit(device=True, inline=True)
def store_staged16(c, stage16, half, m0, n0, t, threads, rows):
    """Half ``half`` of ``stage16`` (``rows`` x ``CHUNK`` packed words, as
    :func:`make_stage_chunk_f16` wrote them) to C at (m0, n0) by ``threads`` threads, of
    which this is number ``t``: 16 bytes a thread at a time, 8 threads a row of 128 bytes."""
    for q in range(rows * CHUNK // 8 // threads):
        unit = t + threads * q
        row = unit // (CHUNK // 8)
        col = (unit % (CHUNK // 8)) * 8
        at = half * rows + row
        words = pnex.vload(stage16, at * (CHUNK // 2) + (tc.swizzle(at, col, CHUNK) >> 1), 4)
        tc.store_words(c, (m0 + row, n0 + col), words)


def make_chunk16(act, gelu, bf16, rows, threads):
    """One chunk of a persistent kernel's epilogue, as its ``threads`` threads (those that
    hold the ``rows`` rows of accumulators) take it: columns ``chunk * CHUNK`` on of ``acc``
    through half ``half`` of ``stage16`` (:func:`make_stage_chunk_f16`, ``act(x + bias)``
    with ``gelu``), then the named barrier ``barrier`` among the ``threads``, then the half
    stored to C at (``m0``, ``n0 + chunk * CHUNK``) (:func:`store_staged16`; ``t``: this
    thread's number among them).  One barrier a chunk is enough when chunks alternate
    halves: a thread stages into the half the chunk before the last used only after the
    last chunk's barrier, which every thread reached after storing from that half."""
    stage = make_stage_chunk_f16(act, gelu, bf16, rows)

    @cuda.jit(device=True, inline=True)
    def chunk16(c, stage16, half, sbias, bias0, acc, chunk, r, col, m0, n0, t, barrier):
        stage(stage16, half, sbias, bias0 + chunk * CHUNK, acc, chunk, r, col)
        tc.named_barrier(barrier, threads)
        store_staged16(c, stage16, half, m0, n0 + chunk * CHUNK, t, threads, rows)

    return chunk16


def gelu_fits(who, bm, threads, bn_choices, stage_choices, bk=64):
    """Refuse the GELU epilogue's tile choices whose float32 tile (``bm`` x BN x 4 bytes)
    does not fit the tile buffers it reuses (STAGES x (``bm`` + BN) x ``bk`` x 2 bytes),
    and widths the staging's layout (:func:`f32_unit`: BN >= 32) or its ``threads``
    storing threads do not take (each keeps its 8 columns: BN / 8 divides ``threads``).
    ``who`` names the caller in the messages."""
    for bn in bn_choices:
        if bn not in GELU_WIDTHS or threads % (bn // 8):
            raise ValueError(f"{who}(gelu=True): BN must be 32, 64, 128 or 256 (the float32 staging's rows hold 8 "
                             f"16-byte units or more, and each of the {threads} storing threads keeps its 8 columns), "
                             f"got {bn}")
        for stages in stage_choices:
            staged, buffers = bm * bn * 4, stages * (bm + bn) * bk * 2
            if staged > buffers:
                least = -(-staged // ((bm + bn) * bk * 2))
                raise ValueError(f"{who}(gelu=True): BN = {bn} with STAGES = {stages}: the float32 tile the GELU "
                                 f"epilogue stages ({staged // 1024} KiB) does not fit the {stages} tile buffers it "
                                 f"reuses ({buffers // 1024} KiB); give stages >= {least} for BN = {bn}")
