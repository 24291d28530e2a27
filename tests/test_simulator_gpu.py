"""The CUDA simulator against the GPU (issue 34): the same pnex op on CPU and on CUDA
tensors gives the same results.

* Random kernels (``tests/random_kernels.py`` in its GPU mode: float32/float64/int32/
  int64 mixes, literals, loops, branches, integer arithmetic, float ``%``, saturating
  conversions; no transcendental function), compiled with NVVM's floating-point
  contraction off (:func:`random_kernels.no_contraction`: by default NVVM and ptxas
  fuse ``a * b + c`` into one ``fma``, one rounding where the simulator rounds twice):
  bit for bit, NaN equal to NaN.  ``PNEX_SIM_VS_GPU_KERNELS`` kernels (default 60),
  from a fresh seed (``PNEX_SIM_VS_GPU_SEED`` repeats one).
* Each ``math.*`` function of float32 and float64 (and float16 where Numba-CUDA has
  it), on inputs across its domain: the simulator's result within libdevice's
  documented bound (:data:`pnex_magic.simtyping.runtime.TRANSCENDENTAL`) plus one ulp
  of the GPU's; exact functions (``sqrt``, ``floor``, ``fmod``, ...) bit for bit.
* float16 and bfloat16 arithmetic: bit for bit.

``benchmarks/sim_vs_gpu.py`` runs the random comparison at scale and writes its
summary (GPU, counts, and how many kernels differ when contraction is left on).
"""

import os
import random
import sys

import pytest
import torch
from numba import cuda

import random_kernels as rk

pytestmark = pytest.mark.gpu

COUNT = int(os.environ.get("PNEX_SIM_VS_GPU_KERNELS", "60"))


@pytest.fixture()
def folder(tmp_path):
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))


def test_random_kernels_agree_bit_for_bit_with_the_gpu(folder, gpu_cache):
    import pnex_magic as pnex

    base = int(os.environ.get("PNEX_SIM_VS_GPU_SEED", str(random.SystemRandom().randrange(2**31))))
    refused = 0
    for k in range(COUNT):
        seed = base + k
        kernel = rk.random_kernel(random.Random(seed), gpu=True, seed=seed)
        module = rk.load(kernel.kernel_source(), kernel.name, folder)
        try:
            with rk.no_contraction():  # compiled now, at the definition (into this test's own cache)
                op = pnex.jit(n_threads="a.numel()", threads_per_block=rk.TPB)(getattr(module, kernel.name))
        except pnex.KernelTypingError as exc:
            # Numba refuses the kernel at its definition, on any machine (a folded integer literal
            # beyond int64, "Int value is too large"): nothing runs, on either device.
            assert "too large" in str(exc), f"seed {seed}: {exc}\n{kernel.kernel_source()}"
            refused += 1
            continue
        values = kernel.inputs(seed)
        cpu, gpu = rk.run_op(kernel, op, values, "cpu"), rk.run_op(kernel, op, values, "cuda")
        problems = rk.differences(cpu, gpu)
        assert not problems, f"seed {seed} (PNEX_SIM_VS_GPU_SEED={base}, kernel {k}): {problems}\n" \
                             f"{kernel.kernel_source()}"
    assert refused <= COUNT // 4, f"{refused} of {COUNT} random kernels refused by Numba: the generator went wrong"
    print(f"\n{COUNT - refused} random kernels ({refused} refused by Numba) bit for bit equal on "
          f"{torch.cuda.get_device_name()} (seeds {base}..)")


#: (function, arity, the inputs' range)
_FUNCTIONS = [
    ("exp", 1, (-80, 80)), ("exp2", 1, (-120, 120)), ("expm1", 1, (-5, 5)), ("log", 1, (1e-6, 1e6)),
    ("log2", 1, (1e-6, 1e6)), ("log10", 1, (1e-6, 1e6)), ("log1p", 1, (-0.99, 100)), ("sin", 1, (-100, 100)),
    ("cos", 1, (-100, 100)), ("tan", 1, (-1.5, 1.5)), ("asin", 1, (-1, 1)), ("acos", 1, (-1, 1)),
    ("atan", 1, (-100, 100)), ("sinh", 1, (-80, 80)), ("cosh", 1, (-80, 80)), ("tanh", 1, (-10, 10)),
    ("asinh", 1, (-100, 100)), ("acosh", 1, (1, 100)), ("atanh", 1, (-0.99, 0.99)), ("erf", 1, (-4, 4)),
    ("erfc", 1, (-2, 9)), ("gamma", 1, (0.1, 30)), ("lgamma", 1, (0.1, 100)), ("atan2", 2, (-10, 10)),
    ("hypot", 2, (-1e3, 1e3)), ("pow", 2, (0.01, 10)),
    ("sqrt", 1, (0, 1e6)), ("fabs", 1, (-10, 10)), ("floor", 1, (-1e3, 1e3)), ("ceil", 1, (-1e3, 1e3)),
    ("trunc", 1, (-1e3, 1e3)), ("copysign", 2, (-10, 10)), ("fmod", 2, (-100, 100)), ("remainder", 2, (-100, 100)),
    ("radians", 1, (-1e3, 1e3)), ("degrees", 1, (-10, 10)),
]
_HALF = ("sin", "cos", "log", "log2", "log10", "exp", "exp2", "sqrt", "fabs", "floor", "ceil", "trunc")


def _math_kernel(name: str, arity: int, dtype: str, folder):
    params = 'x: pnex.In("{0}", (None,)), y: pnex.In("{0}", "x"), r: pnex.Out("{0}", "x")'.format(dtype)
    call = f"math.{name}(x[i])" if arity == 1 else f"math.{name}(x[i], y[i])"
    source = "\n".join([
        "import math", "from numba import cuda", "import pnex_magic as pnex", "", "",
        f"def math_{name}_{dtype}({params}):", "    i = cuda.grid(1)", "    if i < x.shape[0]:",
        f"        r[i] = {call}", ""])
    module = rk.load(source, f"math_{name}_{dtype}_{os.getpid()}", folder)
    return getattr(module, f"math_{name}_{dtype}")


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16"])
@pytest.mark.parametrize("name, arity, domain", _FUNCTIONS, ids=[f[0] for f in _FUNCTIONS])
def test_math_functions_are_within_libdevices_bound(name, arity, domain, dtype, folder, gpu_cache):
    import pnex_magic as pnex
    from pnex_magic.simtyping.runtime import EXACT_MATH, TRANSCENDENTAL

    if dtype == "f16" and name not in _HALF:
        pytest.skip(f"Numba-CUDA has no float16 math.{name}")
    op = pnex.jit(n_threads="x.numel()", threads_per_block=128)(_math_kernel(name, arity, dtype, folder))
    tdt = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16}[dtype]
    g = torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))
    lo, hi = domain
    if dtype == "f16":
        lo, hi = max(lo, -60000.0), min(hi, 60000.0)
    x = (torch.rand(4096, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(tdt)
    y = (torch.rand(4096, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(tdt)
    cpu, gpu = op(x, y).numpy(), op(x.cuda(), y.cuda()).cpu().numpy()
    distance = rk.math_distance(name, cpu, gpu)
    if name in EXACT_MATH:
        allowed = 0
    else:
        allowed = (TRANSCENDENTAL[name][0 if dtype == "f32" else 1] if dtype != "f16" else 1) + 1
    worst = int(distance.max())
    assert worst <= allowed, (f"math.{name} ({dtype}): {worst} ulp apart at x={x[int(distance.argmax())]!r} "
                              f"(CPU {cpu[distance.argmax()]!r}, GPU {gpu[distance.argmax()]!r}); allowed {allowed}")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_arithmetic_agrees_bit_for_bit(dtype, gpu_cache):
    import pnex_magic as pnex

    def half_arith(x: pnex.In(dtype, (None,)), y: pnex.In(dtype, "x"), s: pnex.Scalar(dtype),
                   a: pnex.Out(dtype, "x"), m: pnex.Out(dtype, "x"), q: pnex.Out(dtype, "x"), w: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            a[i] = x[i] + y[i]  # each rounded to the half type (no product meets a sum: nothing to fuse)
            m[i] = x[i] * s
            q[i] = max(x[i], y[i]) - y[i]
            w[i] = x[i] * 0.1 + y[i]  # half * float64: float64

    with rk.no_contraction():
        op = pnex.jit(n_threads="x.numel()")(half_arith)
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    g = torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))
    x, y = ((torch.randn(2048, generator=g) * 30).to(tdt) for _ in range(2))
    cpu = [t.double() for t in op(x, y, 0.37)]
    gpu = [t.cpu().double() for t in op(x.cuda(), y.cuda(), 0.37)]
    for c, d in zip(cpu, gpu):
        torch.testing.assert_close(c, d, rtol=0, atol=0, equal_nan=True)
