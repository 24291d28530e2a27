"""Random kernels for the CUDA simulator's differential tests (issue 34).

A kernel mixes float32, float64, int32 and int64 arrays and scalars, Python literals
(0.1, 3, 3000000000), locals, a loop whose accumulator may change type, branches,
a conditional expression, integer arithmetic (``//``, ``%``, shifts, wrap-around)
and ``math.*``.  Its float expressions are the derived backward's random expression
trees (``tests/test_adjoint_random.py``: :func:`tree`, its operations and their
domain guards), over leaves of every type; its integer expressions come from
:func:`int_tree`.

The same kernel is written three ways from one description (:class:`RandomKernel`):

* :meth:`RandomKernel.kernel_source`: a pnex kernel (``@pnex.jit`` annotations), one
  thread per element;
* :meth:`RandomKernel.plain_source`: the same ``def`` without pnex, for the CUDA
  simulator driven directly (:func:`simulate`) and for Numba's typing;
* :meth:`RandomKernel.reference_source`: the body in a loop over the elements, for
  ``numba.njit(error_model="numpy")``: Numba's CPU target, whose typing rules are
  Numba-CUDA's.  Where the two targets compute differently by design, the reference
  calls helpers that compute as Numba-CUDA does (:data:`REFERENCE_HELPERS`):
  transcendental functions of float32 through the C library's double-precision
  function rounded once, as the simulator computes them (libdevice's own are
  checked against the GPU, within their bounds, by the GPU test).  The generator in
  CPU mode (``gpu=False``) leaves out what Numba's CPU target computes otherwise than
  the GPU: float ``%`` and ``//`` (NVVM's ``frem`` is not C's ``fmod``) and float to
  integer conversions out of range (PTX saturates, x86 gives ``INT_MIN``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import itertools
import math
import os
import random
from pathlib import Path

import numpy as np

from test_adjoint_random import _KERNEL, BINARY, UNARY

N = 64  # elements (threads) per launch
TPB = 32

ARRAYS = {"a": "f32", "b": "f64", "c": "i32", "d": "i64"}
SCALARS = {"sf": "f32", "sd": "f64", "si": "i32", "sl": "i64"}
OUTPUTS = {"r0": "f64", "r1": "f32", "r2": "i64", "r3": "i32"}
NUMPY = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}
FLOAT_LITERALS = ["0.75", "2.5", "-1.5", "0.1", "1e-3"]
INT_LITERALS = ["3", "-7", "1", "100000", "3000000000", "-2"]
#: the float trees' integer leaves (a power of one is integer arithmetic)
INT_LEAVES = frozenset(["c[i]", "d[i]", "si", "sl", "i", "n0", "k", *INT_LITERALS])
#: math.* functions rewritten in the reference (their float32 forms: double, then rounded once)
TRANSCENDENTAL = ("exp", "expm1", "log", "log1p", "sin", "cos", "tan", "tanh", "erf", "atan2", "hypot", "pow")
_CPU_FLOAT_OPS = [op for op in UNARY + BINARY if op != "mod"]
#: The tree's operations the GPU computes exactly (sqrt, division, powers of 2 and 3 by
#: multiplication, NVVM's remainder): the simulator must agree bit for bit.
GPU_EXACT_OPS = ["pos", "neg", "reciprocal", "sqrt", "fabs", "abs", "cast", "add", "sub", "mul", "div", "pow_int",
                 "min", "max", "mod"]


def tree(rng: random.Random, depth: int, leaves: list[str], ops: list[str]):
    """The derived backward's random expression tree (``test_adjoint_random.tree``:
    the same operations, formats and domain guards), its operations drawn from
    ``ops`` at every depth."""
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(leaves)
    op = rng.choice(ops)
    if op in UNARY:
        child = tree(rng, depth - 1, leaves, ops)
        if op in ("log", "sqrt", "log1p", "reciprocal"):
            child = ("positive", child)
        elif op == "tan":
            child = ("tanhalf", child)
        return (op, child)
    left, right = tree(rng, depth - 1, leaves, ops), tree(rng, depth - 1, leaves, ops)
    if op in ("div", "mod"):
        right = ("positive", right)
    elif op in ("pow", "mpow"):
        left = ("positive", left)
    elif op == "pow_int":
        right = rng.choice(["2", "3"])
        if left in INT_LEAVES:
            # an integer base: its power is integer arithmetic, reduced first as int_tree's
            # (Numba folds ``3000000000 ** 3`` at typing and refuses the literal; a stored
            # int32 or int64 near 2**31 cubed leaves int64)
            left = f"({left} % 1291)"
    return (op, left, right)


def int_tree(rng: random.Random, depth: int, leaves: list[str]) -> str:
    """A random integer expression (text): floor division and modulo of negative
    numbers (and by zero: 0 under Numba's numpy error model), shifts by 0 to 7,
    ``abs``, ``min``, ``max``, powers.  Signed overflow is undefined in Numba (its
    integer arithmetic carries LLVM's ``nsw``: the optimiser may assume it never
    happens, on the CPU as on the GPU), so the operands of products and powers are
    reduced first (``x % 46341``, ``x % 1291``) and no value leaves int64; int32
    results wrap where they are stored (a conversion, which Numba defines)."""
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(leaves)
    left, right = int_tree(rng, depth - 1, leaves), int_tree(rng, depth - 1, leaves)
    op = rng.choice(["+", "-", "*", "//", "%", "&", "|", "^", "<<", ">>", "neg", "abs", "min", "max", "pow"])
    if op in ("<<", ">>"):
        return f"(({left} % 65536) {op} ({right} & 7))"
    if op == "neg":
        return f"(-{left})"
    if op == "abs":
        return f"abs({left})"
    if op in ("min", "max"):
        return f"{op}({left}, {right})"
    if op == "pow":
        return f"(({left} % 1291) ** {rng.choice(['2', '3'])})"
    if op == "*":
        return f"(({left} % 46341) * ({right} % 46341))"
    return f"({left} {op} {right})"


def render(node, reference: bool) -> str:
    """A tree of :func:`tree` as kernel text; ``reference``: transcendental calls go
    to the reference's helpers (``_T.exp(x)``)."""
    if isinstance(node, str):
        return node
    op, children = node[0], [render(c, reference) for c in node[1:]]
    if reference and not _folds(render(node, False)):
        # (an expression of literals alone, ``(1.25 + -7 * -7) ** -7``, CPython folds into
        # one constant, with its own ``pow``, before Numba sees the code: in the kernel as
        # in the reference, which must then not call a helper)
        name = {"mpow": "pow", "tanhalf": None}.get(op, op)
        if name in TRANSCENDENTAL and op != "pow":
            return f"_T.{name}({', '.join(children)})"
        if op == "pow":
            return f"_T.power({children[0]}, {children[1]})"
        if op == "tanhalf":
            return f"(0.5 * _T.tanh({children[0]}))"
    return _KERNEL[op].format(*children)


@functools.lru_cache(maxsize=None)
def _folds(text: str) -> bool:
    """Whether CPython compiles the expression ``text`` to one constant."""
    import dis

    ops = [i.opname for i in dis.get_instructions(compile(text, "<fold>", "eval"))
           if i.opname not in ("RESUME", "NOP", "CACHE")]
    return ops in (["LOAD_CONST", "RETURN_VALUE"], ["RETURN_CONST"])


@dataclasses.dataclass
class RandomKernel:
    """One random kernel: its body as lines of (indent, statement template) whose
    expressions are trees rendered for the kernel or the reference."""

    name: str
    lines: list[tuple[int, str, tuple]]
    scalar_kinds: dict[str, str]
    seed: int
    gpu: bool = False

    def body(self, reference: bool) -> list[str]:
        out = []
        for indent, text, trees in self.lines:
            line = text.format(*(render(t, reference) for t in trees))
            if reference:  # a regression case's own text: math.pow as Numba-CUDA types it
                line = line.replace("math.pow(", "_T.pow(")
            out.append("    " * indent + line)
        return out

    def _params(self, annotated: bool) -> str:
        parts = []
        for name, kind in ARRAYS.items():
            parts.append(f'{name}: pnex.In("{kind}", (None,))' if annotated else name)
        for name in SCALARS:
            kind = self.scalar_kinds[name]
            annotation = kind if kind in ("float", "int") else f'pnex.Scalar("{kind}")'
            parts.append(f"{name}: {annotation}" if annotated else name)
        for name, kind in OUTPUTS.items():
            parts.append(f'{name}: pnex.Out("{kind}", "a")' if annotated else name)
        return ", ".join(parts)

    def _header(self) -> list[str]:
        return ["import math", "import numpy as np", "from numba import cuda", "import pnex_magic as pnex", "", ""]

    def kernel_source(self) -> str:
        lines = self._header() + [f"def {self.name}({self._params(True)}):",
                                  "    i = cuda.grid(1)", "    if i < a.shape[0]:"]
        return "\n".join(lines + ["        " + ln for ln in self.body(False)]) + "\n"

    def plain_source(self) -> str:
        lines = self._header() + [f"def {self.name}({self._params(False)}):",
                                  "    i = cuda.grid(1)", "    if i < a.shape[0]:"]
        return "\n".join(lines + ["        " + ln for ln in self.body(False)]) + "\n"

    def reference_source(self) -> str:
        lines = ["import math", "import numpy as np", "from numba import njit", "import reference_helpers as _T", "",
                 "", "@njit(error_model='numpy')", f"def {self.name}_reference({self._params(False)}):",
                 "    for i in range(a.shape[0]):"]
        return "\n".join(lines + ["        " + ln for ln in self.body(True)]) + "\n"

    def inputs(self, seed: int) -> dict[str, object]:
        """Fresh inputs: floats in [-3, 3] (a few exact integers among them),
        integers in [-1000, 1000] with some near the int32 limits."""
        rng = np.random.default_rng(seed)
        values: dict[str, object] = {
            "a": (rng.uniform(-3, 3, N)).astype(np.float32),
            "b": rng.uniform(-3, 3, N),
            "c": rng.integers(-1000, 1000, N).astype(np.int32),
            "d": rng.integers(-1000, 1000, N).astype(np.int64),  # (int64 leaves stay within 2**31: see int_tree)
        }
        values["a"][::7] = np.round(values["a"][::7])
        # (not -2**31: as the exponent of a float ``**`` Numba's int_power negates it, which overflows: an
        # OverflowError on the CPU target, undefined on the GPU)
        values["c"][::5] = rng.choice([2**31 - 1, -(2**31) + 1, 2**30, 65536], size=len(values["c"][::5]))
        values["d"][::6] = rng.integers(-(2**31), 2**31, size=len(values["d"][::6]))
        scalars = {"f32": lambda: np.float32(rng.uniform(-2, 2)), "f64": lambda: float(rng.uniform(-2, 2)),
                   "i32": lambda: int(rng.integers(-50, 50)), "i64": lambda: int(rng.integers(-50, 50)),
                   "float": lambda: float(np.float32(rng.uniform(-2, 2))), "int": lambda: int(rng.integers(-50, 50))}
        for name in SCALARS:
            values[name] = scalars[self.scalar_kinds[name]]()
        return values


_names = itertools.count()


def random_kernel(rng: random.Random, gpu: bool = False, seed: int = 0) -> RandomKernel:
    """A random kernel (see the module docstring); ``gpu``: for the comparison with the
    GPU, bit for bit: also the operations whose GPU semantics Numba's CPU target does
    not share (float ``%``, float to integer conversions out of range), and no
    transcendental function (libdevice's differ by ulps; ``tests/test_simulator_gpu.py``
    checks them one by one)."""
    float_ops = GPU_EXACT_OPS if gpu else _CPU_FLOAT_OPS
    scalar_kinds = {"sf": rng.choice(["f32", "float"]), "sd": "f64", "si": "i32", "sl": rng.choice(["i64", "int"])}
    floats = ["a[i]", "b[i]", "sf", "sd", rng.choice(FLOAT_LITERALS)]
    ints = ["c[i]", "d[i]", "si", "sl", "i", rng.choice(INT_LITERALS), rng.choice(INT_LITERALS)]
    lines: list[tuple[int, str, tuple]] = []

    def ftree(depth: int, extra: list[str] = ()) -> object:
        return tree(rng, depth, floats + list(extra) + rng.sample(ints, 2), float_ops)

    def itree(depth: int, extra: list[str] = ()) -> str:
        return int_tree(rng, depth, ints + list(extra))

    lines.append((0, "t0 = {}", (ftree(3),)))
    lines.append((0, "n0 = " + itree(3), ()))
    start = rng.choice(["0", "0.0", "a[i]", "c[i]", "n0"])
    lines.append((0, f"acc = {start}", ()))
    trips = rng.choice(["3", "(c[i] & 3)", "4", "(si & 3)"])
    lines.append((0, f"for k in range({trips}):", ()))
    update = rng.choice(["acc += {}", "acc = acc * 0.5 + {}", "acc -= {}"])
    if rng.random() < 0.3 and start in ("0", "c[i]", "n0"):
        lines.append((1, "acc += " + itree(2, ["k"]), ()))
    else:
        lines.append((1, update, (ftree(2, ["k", "t0"]),)))
    if rng.random() < 0.5:
        lines.append((1, "if {} > 0.5:", (ftree(2, ["k", "acc"]),)))
        lines.append((2, rng.choice(["t0 = {}", "break", "continue", "n0 = n0 + k"]), (ftree(2, ["k"]),)))
    lines.append((0, "if {} > {}:", (ftree(2, ["t0", "acc"]), ftree(1))))
    lines.append((1, "t1 = {}", (ftree(2, ["t0"]),)))
    lines.append((0, "else:", ()))
    lines.append((1, rng.choice(["t1 = " + itree(2, ["n0"]), "t1 = {}"]), (ftree(2, ["acc"]),)))
    lines.append((0, "w = {} if n0 > 0 else {}", (ftree(2, ["t1"]), ftree(1, ["n0"]))))
    lines.append((0, "r0[i] = {}", (ftree(3, ["t0", "t1", "acc", "w"]),)))
    lines.append((0, "r1[i] = {}", (ftree(3, ["t0", "t1", "acc", "w"]),)))
    lines.append((0, "r2[i] = " + itree(3, ["n0"]), ()))
    bounded = "int({0} if -1e6 < {0} < 1e6 else 0.0)" if not gpu else "int({0})"
    converted = ftree(2, ["t1", "w"])
    lines.append((0, "r3[i] = " + rng.choice([itree(3, ["n0"]), bounded.replace("{0}", "{}")]),
                  (converted,) * (bounded.count("{0}") if "{0}" in bounded else 1)))
    return RandomKernel(f"random_sim_kernel_{os.getpid()}_{next(_names)}", lines, scalar_kinds, seed, gpu)


# ----------------------------------------------------------------------------- running them


def load(source: str, name: str, folder: Path):
    """Write ``source`` to ``folder`` (pnex reads a kernel's source from its file) and
    import it; returns the module."""
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def argtypes(kernel: RandomKernel) -> tuple:
    """The Numba types pnex's compile gives the kernel's parameters."""
    from numba.cuda import types as t

    from pnex_magic.dtypes import resolve_dtype

    sig = [t.Array(resolve_dtype(k).numba_type(), 1, "A", readonly=True) for k in ARRAYS.values()]
    sig += [resolve_dtype({"float": "f32", "int": "i64"}.get(k, k)).numba_type() for k in kernel.scalar_kinds.values()]
    sig += [t.Array(resolve_dtype(k).numba_type(), 1, "C") for k in OUTPUTS.values()]
    return tuple(sig)


def poisoned_outputs() -> dict[str, np.ndarray]:
    fill = {"f64": np.nan, "f32": np.nan, "i64": -(2**63) + 1, "i32": -(2**31) + 1}
    return {name: np.full(N, fill[k], dtype=NUMPY[k]) for name, k in OUTPUTS.items()}


def simulate(kernel: RandomKernel, module, values: dict) -> tuple[dict[str, np.ndarray], dict[str, set[str]]]:
    """The kernel run by the CUDA simulator through pnex's typed rewrite (as pnex runs a
    kernel on CPU tensors, without the op around it), and the types the rewrite gave
    its variables (checked against Numba-CUDA's own on the way)."""
    import warnings

    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    from pnex_magic.simtyping import numba_types
    from pnex_magic.simtyping.kernel import Build, param_val
    from pnex_magic.snapshot import freeze, simulable

    fn = freeze(getattr(module, kernel.name)).function
    sig = argtypes(kernel)
    numba_types.refresh()
    build = Build(kernel.name)
    typed, walker, _ = build.function(fn, [param_val(t) for t in sig], "the kernel", returns=False)
    build.cross_check(fn, sig)
    outs = poisoned_outputs()
    args = [FakeCUDAArray(values[n]) for n in ARRAYS] + [NUMPY[_kind(kernel, n)](values[n]) for n in SCALARS]
    args += [FakeCUDAArray(outs[n]) for n in OUTPUTS]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero|underflow) encountered",
                                RuntimeWarning)
        FakeCUDAKernel(simulable(typed, kernel.name), device=False)[math.ceil(N / TPB), TPB](*args)
    types = {name: {str(t) for t in tys} for name, tys in walker.assigned.items()}
    return outs, types


def _kind(kernel: RandomKernel, scalar: str) -> str:
    kind = kernel.scalar_kinds[scalar]
    return {"float": "f32", "int": "i64"}.get(kind, kind)


def reference(kernel: RandomKernel, module, values: dict) -> tuple[dict[str, np.ndarray], dict[str, set[str]]]:
    """The kernel's body run by ``numba.njit`` (Numba's CPU target), and the types
    Numba's CPU target gave its variables."""
    fn = getattr(module, kernel.name + "_reference")
    outs = poisoned_outputs()
    scalars = [NUMPY[_kind(kernel, n)](values[n]) for n in SCALARS]
    fn(*[values[n] for n in ARRAYS], *scalars, *[outs[n] for n in OUTPUTS])
    typemap = next(iter(fn.overloads.values())).type_annotation.typemap
    types: dict[str, set[str]] = {}
    for key, ty in typemap.items():
        if not key.startswith(("$", "arg.")):
            types.setdefault(key.split(".")[0], set()).add(str(ty))
    return outs, types


def differences(got: dict, expected: dict) -> list[str]:
    """Elements that are not bit for bit equal (NaN equals NaN, whatever its bits)."""
    problems = []
    for name in OUTPUTS:
        x, y = got[name], expected[name]
        if x.dtype.kind == "f":
            same = (x.view(f"i{x.itemsize}") == y.view(f"i{y.itemsize}")) | (np.isnan(x) & np.isnan(y))
        else:
            same = x == y
        bad = np.flatnonzero(~same)
        if len(bad):
            k = bad[0]
            problems.append(f"{name}[{k}]: {x[k]!r} against {y[k]!r} ({len(bad)} of {len(x)} differ)")
    return problems


def ulp_distance(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Units in the last place between floats of the same dtype (0 for two NaNs)."""
    bits = {4: np.int32, 8: np.int64, 2: np.int16}[x.itemsize]
    xi, yi = x.view(bits).astype(np.int64), y.view(bits).astype(np.int64)
    top = np.int64(1) << (8 * x.itemsize - 1)
    xi = np.where(xi < 0, -(xi + top) if x.itemsize < 8 else ~xi + 1 - top, xi)
    yi = np.where(yi < 0, -(yi + top) if y.itemsize < 8 else ~yi + 1 - top, yi)
    d = np.abs(xi - yi)
    return np.where(np.isnan(x) & np.isnan(y), 0, d)


def math_distance(name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`ulp_distance`, except for ``lgamma`` where its result is below 1 in magnitude:
    near its zeros (x = 1 and 2) neither libm nor libdevice holds a relative bound (the
    result's ulp shrinks to nothing while the error stays about one ulp of lgamma's scale),
    so there the distance is counted in ulps of 1.0 (an absolute bound)."""
    distance = ulp_distance(x, y)
    if name != "lgamma":
        return distance
    small = (np.abs(x) < 1) & (np.abs(y) < 1) & np.isfinite(x) & np.isfinite(y)
    absolute = np.abs(x.astype(np.float64) - y.astype(np.float64)) / float(np.spacing(x.dtype.type(1)))
    return np.where(small, np.ceil(absolute).astype(np.int64), distance)


def finite_fraction(values: dict) -> float:
    return float(np.mean([np.isfinite(v).mean() for v in values.values() if v.dtype.kind == "f"]))


@contextlib.contextmanager
def no_contraction():
    """Kernels compiled in this block have NVVM's floating-point contraction off
    (``-fma=0``: ``mul.rn``/``add.rn`` in the PTX, which ptxas may not fuse either).
    By default NVVM fuses ``a * b + c`` into ``fma.rn`` and emits ``mul``/``add``
    without a rounding mode, which ptxas may fuse: one rounding where the simulator,
    like Numba's CPU target, rounds twice.  The comparison with the GPU is bit for bit
    on kernels compiled without it; compile them into a cache of their own."""
    from numba.cuda.cudadrv import nvvm

    original = nvvm.compile_ir

    def compile_ir(llvmir, **options):
        options["fma"] = False
        return original(llvmir, **options)

    nvvm.compile_ir = compile_ir
    try:
        yield
    finally:
        nvvm.compile_ir = original


def run_op(kernel: RandomKernel, op, values: dict, device: str) -> dict[str, np.ndarray]:
    """The kernel's pnex op on ``values`` (tensors on ``device``): its outputs."""
    import torch

    args = [torch.from_numpy(values[n]).to(device) for n in ARRAYS]
    args += [float(values[n]) if _kind(kernel, n).startswith("f") else int(values[n]) for n in SCALARS]
    outs = op(*args)
    return {name: t.cpu().numpy() for name, t in zip(OUTPUTS, outs)}


__all__ = ["RandomKernel", "random_kernel", "int_tree", "render", "load", "simulate", "reference", "differences",
           "argtypes", "ulp_distance", "no_contraction", "run_op", "GPU_EXACT_OPS", "N", "TPB", "ARRAYS", "SCALARS",
           "OUTPUTS"]
