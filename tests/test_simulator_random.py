"""Random kernels: the CUDA simulator against Numba's CPU target, bit for bit (issue 34).

Each kernel (``tests/random_kernels.py``: the derived backward's random expression
trees over float32/float64/int32/int64 arrays, scalars and literals, with locals, a
loop whose accumulator may change type, branches, a conditional expression, integer
arithmetic and ``math.*``) runs twice on fresh inputs:

* in the CUDA simulator, through pnex's typed rewrite (checked on the way against
  Numba-CUDA's own typing of the kernel);
* compiled by ``numba.njit(error_model="numpy")``, Numba's CPU target, whose typing
  rules are Numba-CUDA's: the test first checks that both targets gave every variable
  the same types (else the kernel says nothing and another is drawn; counted).

Every output must be equal bit for bit (NaN equal to NaN).  Where the CPU target
computes otherwise than the GPU by design (float ``%``, float to integer conversion
out of range), the generator leaves the operation out on this side; the GPU test
(``tests/test_simulator_gpu.py``) has it.  Transcendental functions of float32 are
the C library's double-precision function rounded once on both sides
(``tests/reference_helpers.py``): their accuracy against libdevice is the GPU test's.

A run checks ``PNEX_SIM_RANDOM_KERNELS`` kernels (default 24; CI's share is about
40 s on two cores) from a fresh seed (``PNEX_SIM_RANDOM_SEED`` repeats one), within
``PNEX_SIM_RANDOM_SECONDS`` (default 90).  A kernel that ever differed stays below as
a regression case, written out.
"""

from __future__ import annotations

import os
import re
import random
import sys
import time
from pathlib import Path

import pytest

import random_kernels as rk

COUNT = int(os.environ.get("PNEX_SIM_RANDOM_KERNELS", "24"))
SECONDS = float(os.environ.get("PNEX_SIM_RANDOM_SECONDS", "90"))


@pytest.fixture()
def folder(tmp_path):
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))


def check(kernel: rk.RandomKernel, folder: Path, seed: int) -> str:
    """``"same"``, ``"targets differ"`` (Numba's CPU and CUDA targets typed a variable
    differently: no reference), or raises AssertionError with what differs."""
    module = rk.load(kernel.plain_source(), kernel.name, folder)
    reference = rk.load(kernel.reference_source(), kernel.name + "_reference", folder)
    values = kernel.inputs(seed)
    got, ours = rk.simulate(kernel, module, values)
    expected, cpu = rk.reference(kernel, reference, values)
    # (arrays aside: pnex's are "A" layout and read-only where the reference's are NumPy's own)
    if any(cpu.get(name, ts) != ts for name, ts in ours.items() if not any("array(" in t for t in ts)):
        return "targets differ"
    problems = rk.differences(got, expected)
    assert not problems, f"seed {seed}: {problems}\n{kernel.plain_source()}"
    return "same"


def test_random_kernels_agree_bit_for_bit_with_numba_cpu(folder):
    base = int(os.environ.get("PNEX_SIM_RANDOM_SEED", str(random.SystemRandom().randrange(2**31))))
    counts = {"same": 0, "targets differ": 0}
    start = time.perf_counter()
    k = 0
    while counts["same"] < COUNT and time.perf_counter() - start < SECONDS:
        seed = base + k
        k += 1
        kernel = rk.random_kernel(random.Random(seed), seed=seed)
        try:
            counts[check(kernel, folder, seed)] += 1
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(f"seed {seed} (PNEX_SIM_RANDOM_SEED={base}): {type(exc).__name__}: {exc}\n"
                                 f"{kernel.plain_source()}") from exc
    print(f"\n{counts['same']} random kernels bit for bit equal to numba.njit's ({counts['targets differ']} left "
          f"out: Numba's targets typed them differently), seeds {base}.., {time.perf_counter() - start:.0f} s")
    assert counts["same"] >= min(COUNT, 8), counts


# ----------------------------------------------------------------------------- regressions

#: Kernels that differed once (the rule each broke, then the body). Scalars: sf f32, sd
#: f64, si i32, sl i64; arrays a f32, b f64, c i32, d i64; outputs r0 f64, r1 f32, r2 i64, r3 i32.
REGRESSIONS = {
    "CPython folds 100000 ** 3 into a literal, which Numba types as Literal[int]": [
        "n0 = (100000 ** 3)",
        "acc = n0",
        "for k in range(3):",
        "    acc = acc * 0.5 + math.atan2(math.hypot(si, k), si)",
        "t1 = 100000 if a[i] > 0 else (1 ** 3)",
        "r0[i] = acc + t1",
        "r1[i] = t1 * 0.1",
        "r2[i] = n0 // 7",
        "r3[i] = (1 ** 3) + c[i]",
    ],
    "math.pow of an int32 exponent is libdevice's powi (square-and-multiply), not pow": [
        "t0 = si",
        "r0[i] = math.pow((1.25 + b[i] * b[i]), t0)",
        "r1[i] = math.pow((1.25 + a[i] * a[i]), si)",
        "r2[i] = d[i]",
        "r3[i] = c[i]",
    ],
    "math.pow of an int64 exponent is pow of its float64 (Numba-CUDA types no other integer exponent)": [
        "r0[i] = math.pow((1.25 + b[i] * b[i]), i)",
        "r1[i] = math.pow((1.25 + a[i] * a[i]), d[i] & 7)",
        "r2[i] = d[i]",
        "r3[i] = c[i]",
    ],
    "math.hypot is the C library's (CPython's own differs in the last bit)": [
        "w = float(max(i, b[i]))",
        "r0[i] = math.cos(math.hypot(sf, math.cos(w)))",
        "r1[i] = math.hypot(w, (sd ** 3))",
        "r2[i] = i",
        "r3[i] = c[i]",
    ],
    "a float raised to a huge integer exponent: Numba's cutoff to pow, not an OverflowError": [
        "w = math.log((1.25 + (sd + 0.75) * (sd + 0.75)))",
        "r0[i] = ((1.25 + w * w) ** (d[i] * 1000003))",
        "r1[i] = a[i] ** (c[i] * 65537)",
        "r2[i] = d[i]",
        "r3[i] = c[i]",
    ],
    "a power of literals alone is CPython's constant (C's pow), not Numba's int_power (CI, seed 1765568995)": [
        "t1 = float(((1.25 + -7 * -7) ** -7))",
        "r0[i] = math.expm1(abs(t1)) + (2.5 ** -3) * b[i]",
        "r1[i] = a[i] * (1.25 + -2 * -2) ** -7",
        "r2[i] = d[i]",
        "r3[i] = c[i]",
    ],
    "a chained comparison whose middle operand each side converts differently": [
        "t1 = a[i] * 1e5",
        "r0[i] = 1.5 < a[i] < 16777217",
        "r1[i] = t1",
        "r2[i] = int(t1 if -1e6 < t1 < 1e6 else 0.0)",
        "r3[i] = int(b[i] * 1e3 if -1e6 < b[i] * 1e3 < 1e6 else 0.0)",
    ],
    "a variable assigned in a loop that may not run, then converted where paths join": [
        "s = 0.0",
        "for k in range(c[i] & 3):",
        "    s += a[i] * k",
        "if s > 0.5:",
        "    for k in range(2):",
        "        s = s + k",
        "else:",
        "    k = 7",
        "r0[i] = s",
        "r1[i] = s * 0.5",
        "r2[i] = d[i] // 3",
        "r3[i] = c[i] % -3",
    ],
}


@pytest.mark.parametrize("rule", list(REGRESSIONS))
def test_regression_kernels(rule, folder):
    seed = random.SystemRandom().randrange(2**31)
    lines = []
    for text in REGRESSIONS[rule]:
        indent = (len(text) - len(text.lstrip(" "))) // 4
        lines.append((indent, text.strip().replace("{", "{{").replace("}", "}}"), ()))
    kernel = rk.RandomKernel(f"regression_{abs(hash(rule)) % 10**8}_{os.getpid()}", lines,
                             {"sf": "f32", "sd": "f64", "si": "i32", "sl": "i64"}, seed)
    assert check(kernel, folder, seed) == "same"


def test_generator_reduces_integer_bases_of_powers():
    """The generator never raises an integer leaf to a power unreduced: Numba folds
    ``3000000000 ** 3`` at typing and refuses the literal ("Int value is too large":
    CI, seed 207433723), and a stored int32 near 2**31 cubed leaves int64.  Seed
    207433723 is the case; the others are a sweep."""
    leaf = "|".join(sorted((re.escape(x) for x in rk.INT_LEAVES), key=len, reverse=True))
    bare = re.compile(rf"\((?:{leaf}) \*\* ")
    for seed in [207433723, *range(1500)]:
        kernel = rk.random_kernel(random.Random(seed), seed=seed)
        source = kernel.plain_source()
        assert not bare.search(source), f"seed {seed}: an unreduced integer power\n{source}"
    assert "(3000000000 % 1291) ** 3" in rk.random_kernel(random.Random(207433723), seed=207433723).plain_source()


def test_reference_leaves_a_power_of_literals_to_cpython(folder):
    """CPython folds ``(1.25 + -7 * -7) ** -7`` into one constant (C's ``pow``) before
    Numba sees the kernel; the reference must not compute it with a helper (Numba's
    ``int_power``, one ulp away: CI, seed 1765568995).  A power of a variable still
    goes through the helper."""
    literal = ("pow", ("positive", "-7"), "-7")
    assert rk.render(literal, True) == rk.render(literal, False)
    assert rk.render(("pow", ("positive", "b[i]"), "-7"), True).startswith("_T.power(")
    assert check(rk.random_kernel(random.Random(1765568995), seed=1765568995), folder, 1765568995) == "same"
