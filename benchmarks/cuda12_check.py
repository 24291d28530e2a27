"""The CUDA 12 toolchain path (what Colab's CUDA 12 drivers need: ``pnex_magic[cu12]``),
proved without Colab.

NVVM and nvJitLink from the CUDA 12 wheels compile a Numba-CUDA kernel to PTX and
link it into a cubin for sm_75 (Colab's T4) and, on a GPU, for the GPU's own
architecture; each cubin's ELF header must name its target (``pnex_magic/cubin.py``).
A kernel that synchronises its grid (``cuda.cg.this_grid().sync()``) is linked by
pnex's own ``pnex_magic/linking.py`` (loaded on its own) with the CUDA 12 device runtime,
``libcudadevrt.a`` from ``nvidia-cuda-runtime-cu12`` (which the ``cu12`` extra brings), and
on a GPU launched cooperatively.
On a GPU the cubin is then loaded with ``cuModuleLoadData`` and launched through the
driver API with ``CUDA_DISABLE_PTX_JIT=1``, so nothing can have been JIT-compiled
from PTX (a control load of the PTX must fail), and its result is checked against
NumPy in float64.

It imports neither torch nor the pnex_magic package, and runs beside an environment
whose packages are CUDA 13 (the GPU image): the CUDA 12 wheels lie in folders of
their own on ``PYTHONPATH``, and this script loads their NVVM and
nvJitLink before anything else can, so cuda.pathfinder (which searches the
interpreter's site-packages, not ``PYTHONPATH``, and would find the CUDA 13 ones)
reuses them.  It checks that it did.

The GPU image's numpy 2.5 breaks numba-cuda 0.30, so a numpy 2.4 wheel goes on
``PYTHONPATH`` first too (below it is carried with NVVM, in the second folder; both
folders come before the image's site-packages).

    # here (PyPI), in the repository root: the wheels for Python 3.12, 110 MB in two folders, because
    # a device call carries at most 64 MiB (working tree included)
    echo /.cu12a/ >> .git/info/exclude; echo /.cu12b/ >> .git/info/exclude
    W="python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
       --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_12_x86_64"
    $W -d .cu12a numba-cuda==0.30.4 "cuda-bindings==12.9.*" cuda-core==1.2.2 cuda-pathfinder==1.9.0 \\
       "nvidia-nvjitlink-cu12==12.9.*" "nvidia-cuda-runtime-cu12==12.9.*"                     # 58 MB
    $W -d .cu12b "nvidia-cuda-nvcc-cu12==12.9.*" "numpy==2.4.*"              # 39 MB NVVM, about 17 MB numpy
    # on the GPU machine (no network), two calls on the same (warm) machine, from the repository root:
    #   carry [".cu12a"]:
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pnex-cu12a .cu12a/*.whl
    #   carry [".cu12b"]:
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pnex-cu12b .cu12b/*.whl &&
    PYTHONPATH=/tmp/pnex-cu12a:/tmp/pnex-cu12b python3 benchmarks/cuda12_check.py

``--compile-only`` skips the GPU (CI runs it so).  It prints a table last, writes
``benchmarks/results/cuda12-check-<date>.json`` and, with ``$OUT`` set, a log there.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
os.environ["CUDA_DISABLE_PTX_JIT"] = "1"  # read by the driver at cuInit: PTX cannot be JIT-compiled

# The CUDA 12 libraries, relative to the folder that holds the wheels.
CUDA12_LIBS = {
    "nvvm": "nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so",
    "nvJitLink": "nvidia/nvjitlink/lib/libnvJitLink.so.12",
}

_log_lines: list[str] = []


def log(text: str) -> None:
    print(text, flush=True)
    _log_lines.append(text)


def _cubin_module():
    """``pnex_magic/cubin.py`` on its own (the package would import torch)."""
    spec = importlib.util.spec_from_file_location("pnex_cubin", REPO / "pnex_magic" / "cubin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def preload_cuda12() -> dict[str, str]:
    """Load the CUDA 12 NVVM and nvJitLink from the first ``sys.path`` folder holding
    them, before numba-cuda or cuda.bindings look for theirs; returns their paths."""
    found = {}
    for name, rel in CUDA12_LIBS.items():
        for folder in sys.path:
            path = Path(folder or ".") / rel
            if path.is_file():
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                found[name] = str(path)
                break
        else:
            raise SystemExit(f"no CUDA 12 {name} ({rel}) on sys.path: put the folder with the CUDA 12 wheels "
                             f"first on PYTHONPATH (see this script's docstring)")
    return found


def toolchain(preloaded: dict[str, str]) -> dict[str, object]:
    from cuda.bindings import nvjitlink
    from cuda.pathfinder import load_nvidia_dynamic_lib
    from numba.cuda.cudadrv import libs, nvvm

    used = {name: load_nvidia_dynamic_lib(name).abs_path for name in CUDA12_LIBS}
    info = {
        "python": sys.version.split()[0],
        "numba-cuda": metadata.version("numba-cuda"),
        "numba": metadata.version("numba"),
        "cuda-bindings": metadata.version("cuda-bindings"),
        "nvJitLink": ".".join(map(str, nvjitlink.version())),
        "NVVM IR": ".".join(map(str, nvvm.NVVM().get_version())),
        "libnvvm": used["nvvm"],
        "libnvJitLink": used["nvJitLink"],
        "libdevice": libs.get_libdevice(),
    }
    for name in CUDA12_LIBS:
        if os.path.realpath(used[name]) != os.path.realpath(preloaded[name]):
            raise SystemExit(f"{name}: cuda.pathfinder loaded {used[name]}, not the CUDA 12 {preloaded[name]}")
    if nvjitlink.version()[0] != 12 or "cuda_nvcc" not in info["libdevice"]:
        raise SystemExit(f"not the CUDA 12 toolchain: {info}")
    return info


def axpy(out, x, y, a):
    i = cuda.grid(1)  # noqa: F821 (`cuda` is bound by compile_cubin, after the CUDA 12 libraries are loaded)
    if i < out.shape[0]:
        out[i] = a * x[i] + y[i]


def compile_cubin(cc: tuple[int, int]) -> tuple[str, bytes, str]:
    """(PTX from NVVM, cubin from nvJitLink, entry) of ``axpy`` for ``cc``."""
    global cuda
    from cuda.core import Linker, LinkerOptions, ObjectCode
    from numba import cuda, float32

    sig = (float32[::1], float32[::1], float32[::1], float32)
    ptx, _ = cuda.compile(axpy, sig, device=False, abi="numba", cc=cc, output="ptx")
    entry = re.search(r"\.visible\s+\.entry\s+([\w$]+)\(", ptx).group(1)
    linker = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}"))
    return ptx, bytes(linker.link("cubin").code), entry


def sequential_rows(M):
    col = cuda.grid(1)  # noqa: F821 (bound by compile_grid_sync)
    g = cuda.cg.this_grid()  # noqa: F821
    for row in range(1, M.shape[0]):
        M[row, col] = M[row - 1, M.shape[1] - col - 1] + 1
        g.sync()


def _pnex_linking():
    """``pnex_magic/linking.py`` (and the ``errors`` module it imports) without the
    package, whose ``__init__`` would import torch."""
    import types

    package = types.ModuleType("pnex_linking_only")
    package.__path__ = [str(REPO / "pnex_magic")]
    sys.modules["pnex_linking_only"] = package
    spec = importlib.util.spec_from_file_location("pnex_linking_only.linking", REPO / "pnex_magic" / "linking.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compile_grid_sync(cc: tuple[int, int]) -> tuple[str, bytes, str, str]:
    """(PTX, cubin, entry, the device runtime's path) of ``sequential_rows``: NVVM's PTX
    linked by pnex's linking.py with the device runtime it picks for this nvJitLink."""
    global cuda
    from numba import cuda, int32

    from numba.cuda import dispatcher

    # Numba compiles cooperative groups' overloads for the current device, which needs a driver:
    # the target stands in for it, as pnex_magic/compiler.py does.
    current = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: type("Target", (), {"compute_capability": cc})()
    try:
        ptx, _ = cuda.compile(sequential_rows, (int32[:, ::1],), device=False, abi="numba", cc=cc, output="ptx")
    finally:
        dispatcher.get_current_device = current
    linking = _pnex_linking()
    if not linking.uses_grid_sync(ptx):
        raise SystemExit("the grid-sync kernel's PTX calls no cudaCG* function")
    _, where = linking.device_runtime()
    cubin, _log = linking.link_cubin(ptx, f"sm_{cc[0]}{cc[1]}", None, "sequential_rows")
    return ptx, cubin, linking.ptx_entry(ptx), where


def run_grid_sync_on_gpu(cc: tuple[int, int]) -> dict[str, object]:
    """Launch the CUDA 12 grid-sync cubin cooperatively (two blocks of 32 threads over a
    64 x 64 int32 matrix) in the current context and check every row."""
    import numpy as np
    from cuda.bindings import driver

    _ptx, cubin, entry, _where = compile_grid_sync(cc)
    module = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData(grid-sync cubin)")
    fn = _check(driver.cuModuleGetFunction(module, entry.encode()), "cuModuleGetFunction")
    n = 64
    m = np.zeros((n, n), np.int32)
    m[0] = np.random.default_rng().integers(-1000, 1000, n)
    m[1:] = -(2**31)  # poisoned: every row must be written
    buf = _check(driver.cuMemAlloc(m.nbytes), "cuMemAlloc")
    _check(driver.cuMemcpyHtoD(buf, m.ctypes.data, m.nbytes), "copy M")
    args = (0, 0, n * n, 4, int(buf), n, n, 4 * n, 4)
    types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
             ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
    _check(driver.cuLaunchCooperativeKernel(fn, 2, 1, 1, 32, 1, 1, 0, 0, (args, types)), "cuLaunchCooperativeKernel")
    _check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
    out = np.empty_like(m)
    _check(driver.cuMemcpyDtoH(out.ctypes.data, buf, m.nbytes), "copy M back")
    driver.cuMemFree(buf)
    expected = m.copy()
    for row in range(1, n):
        expected[row] = expected[row - 1][::-1] + 1
    return {"rows_ok": bool(np.array_equal(out, expected))}


def _check(result, what: str):
    from cuda.bindings import driver

    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)[1]
        raise RuntimeError(f"{what}: {name.decode() if name else err}")
    return result[1] if len(result) == 2 else result[1:]


def run_on_gpu(compile_for) -> dict[str, object]:
    """Load the cubin for the GPU's architecture, launch it, check the result; and
    show that PTX does not load (the JIT is off)."""
    import numpy as np
    from cuda.bindings import driver

    _check(driver.cuInit(0), "cuInit")
    version = _check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    device = _check(driver.cuDeviceGet(0), "cuDeviceGet")
    name = _check(driver.cuDeviceGetName(64, device), "cuDeviceGetName").split(b"\0")[0].decode()
    attr = driver.CUdevice_attribute
    cc = (_check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "cc"),
          _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "cc"))
    ctx = _check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptx, cubin, entry = compile_for(cc)
    ptx_load = driver.cuModuleLoadData(ptx.encode() + b"\0")[0]
    module = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData(cubin)")
    fn = _check(driver.cuModuleGetFunction(module, entry.encode()), "cuModuleGetFunction")

    n, a = 1 << 20, np.float32(0.5)
    rng = np.random.default_rng()
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    bufs = [_check(driver.cuMemAlloc(n * 4), "cuMemAlloc") for _ in range(3)]
    out_d, x_d, y_d = bufs
    _check(driver.cuMemsetD32(out_d, 0x7FC00000, n), "poison out with NaN")
    _check(driver.cuMemcpyHtoD(x_d, x.ctypes.data, n * 4), "copy x")
    _check(driver.cuMemcpyHtoD(y_d, y.ctypes.data, n * 4), "copy y")
    args, types = [], []
    for ptr in (out_d, x_d, y_d):  # Numba's array ABI: meminfo, parent, nitems, itemsize, data, shape, stride
        args += [0, 0, n, 4, int(ptr), n, 4]
        types += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                  ctypes.c_int64, ctypes.c_int64]
    args.append(float(a))
    types.append(ctypes.c_float)
    _check(driver.cuLaunchKernel(fn, (n + 255) // 256, 1, 1, 256, 1, 1, 0, 0, (tuple(args), tuple(types)), 0),
           "cuLaunchKernel")
    _check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
    out = np.empty(n, dtype=np.float32)
    _check(driver.cuMemcpyDtoH(out.ctypes.data, out_d, n * 4), "copy out")
    for ptr in bufs:
        driver.cuMemFree(ptr)
    reference = a.astype(np.float64) * x + y
    return {
        "gpu": name, "driver_cuda": f"{version // 1000}.{(version % 1000) // 10}", "cc": f"sm_{cc[0]}{cc[1]}",
        "cubin": cubin, "ptx_load_with_jit_off": driver.cuGetErrorName(ptx_load)[1].decode(),
        "max_abs_error": float(np.max(np.abs(out - reference))), "all_written": bool(np.isfinite(out).all()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile-only", action="store_true", help="no GPU: compile and check the cubins only")
    parser.add_argument("--no-results", action="store_true", help="write no JSON to benchmarks/results/")
    opts = parser.parse_args(argv)
    preloaded = preload_cuda12()
    cubin_arch = _cubin_module().cubin_arch
    rows: list[tuple[str, str, bool]] = []
    info = toolchain(preloaded)
    for key, value in info.items():
        log(f"{key:14} {value}")

    _ptx, cubin75, _entry = compile_cubin((7, 5))
    rows.append(("sm_75 cubin: ELF header says sm_75", f"{cubin_arch(cubin75)}, ELF ABI {cubin75[8]}",
                 cubin_arch(cubin75) == "sm_75"))
    ptx_sync, cubin_sync, _entry, devrt = compile_grid_sync((7, 5))
    rows.append(("sm_75 grid-sync cubin linked with the CUDA 12 device runtime",
                 f"{cubin_arch(cubin_sync)}, {len(cubin_sync)} B, {devrt}",
                 cubin_arch(cubin_sync) == "sm_75" and "cuda_runtime" in devrt))
    gpu = None
    if not opts.compile_only:
        gpu = run_on_gpu(compile_cubin)
        grid_sync = run_grid_sync_on_gpu((int(gpu["cc"][3:-1]), int(gpu["cc"][-1])))
        rows.append((f"{gpu['cc']} grid-sync cubin launched cooperatively", str(grid_sync), grid_sync["rows_ok"]))
        own = cubin_arch(gpu.pop("cubin"))
        rows.append((f"{gpu['cc']} cubin: ELF header says {gpu['cc']}", own, own == gpu["cc"]))
        rows.append(("PTX refused with CUDA_DISABLE_PTX_JIT=1", gpu["ptx_load_with_jit_off"],
                     gpu["ptx_load_with_jit_off"] != "CUDA_SUCCESS"))
        rows.append((f"cubin ran on {gpu['gpu']} (driver CUDA {gpu['driver_cuda']})",
                     f"max abs error {gpu['max_abs_error']:.2e} vs float64", gpu["all_written"]
                     and gpu["max_abs_error"] < 1e-5))
    ok = all(r[2] for r in rows)
    width = max(len(r[0]) for r in rows)
    log("")
    log(f"{'check'.ljust(width)}  {'ok':4}  result")
    for what, result, good in rows:
        log(f"{what.ljust(width)}  {'yes' if good else 'NO':4}  {result}")
    record = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
        "toolchain": info, "gpu": gpu, "checks": [{"check": w, "result": r, "ok": g} for w, r, g in rows], "ok": ok,
    }
    if not opts.no_results:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"cuda12-check-{_dt.date.today().isoformat()}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        log(f"results: {path}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "cuda12_check.log").write_text("\n".join(_log_lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
