"""The C++ launcher: build it once per environment, register ops with it.

``csrc/launcher.cpp`` is compiled with ``torch.utils.cpp_extension.load`` (ninja, a
host C++ compiler and the CUDA headers; no nvcc) into the cache folder, keyed on
its source, torch, Python and the header folder.  Each pnex op then registers a
boxed C++ functor for the CUDA dispatch key: GPU calls never run Python.

A build is guarded by an ``flock`` that the OS releases when a process dies, and
torch's own lock file, which a killed build leaves behind, is removed under it, so a
killed build never makes the next one hang.  A failed build leaves nothing that
counts as built: the next attempt compiles again and shows the compiler's output.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..cache import cache_dir
from ..errors import KernelCompileError
from ..spec import ScalarParam, TensorParam

if TYPE_CHECKING:
    from ..definition import KernelDefinition

__all__ = ["load_launcher", "register", "available", "native_wanted"]

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "launcher.cpp"
_KINDS = {"in": 0, "inmut": 1, "out": 2, "scalar": 3, "unused": 4}
_module: Any = None
_failure: str | None = None
_load_lock = threading.Lock()


def cuda_include_dir() -> str | None:
    """A folder holding cuda.h: the CUDA toolkit's, else the pip wheels'."""
    from torch.utils.cpp_extension import CUDA_HOME

    candidates = []
    if CUDA_HOME:
        candidates.append(Path(CUDA_HOME) / "include")
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            candidates.append(Path(found))
    except Exception:
        pass
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda.h").exists():
            return str(c)
    return None


def _build_key(include: str) -> str:
    h = hashlib.sha256()
    h.update(_SOURCE.read_bytes())
    h.update(f"{torch.__version__}|{torch.version.cuda}|{sys.version}|{include}".encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _progress(message: str):
    """Tell the user a slow one-time step is running, every few seconds."""
    done = threading.Event()
    start = time.perf_counter()
    print(f"pnex: {message} (once per environment)...", file=sys.stderr, flush=True)

    def tick():
        while not done.wait(5.0):
            print(f"pnex: {message}... {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        print(f"pnex: {message}: done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def load_launcher(verbose: bool = False):
    """Build (first time) and import the launcher extension."""
    global _module, _failure
    if _module is not None:
        return _module
    with _load_lock:
        if _module is not None:
            return _module
        include = cuda_include_dir()
        if include is None:
            raise KernelCompileError(
                "pnex's C++ launcher needs the CUDA headers (cuda.h): install the toolkit or "
                "pip install 'numba-cuda[cu12]' / 'numba-cuda[cu13]'"
            )
        from torch.utils import cpp_extension

        key = _build_key(include)
        root = cache_dir() / "launcher"
        build_dir = root / key
        build_dir.mkdir(parents=True, exist_ok=True)
        lock_path = root / f"{key}.flock"
        name = f"pnex_launcher_{key}"
        torch_lib = str(Path(torch.__file__).parent / "lib")
        with open(lock_path, "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)  # released by the OS if this process dies
            try:
                stale = build_dir / "lock"  # torch's FileBaton, left behind by a killed build
                if stale.exists():
                    stale.unlink()
                built = any(build_dir.glob(f"{name}*.so"))
                ctx = contextlib.nullcontext() if built else _progress("building the C++ launcher")
                with ctx:
                    try:
                        _module = cpp_extension.load(
                            name=name,
                            sources=[str(_SOURCE)],
                            extra_include_paths=[include],
                            extra_cflags=["-O2"],
                            extra_ldflags=[f"-L{torch_lib}", "-lc10_cuda", "-ldl"],
                            build_directory=str(build_dir),
                            with_cuda=False,
                            verbose=verbose,
                        )
                    except Exception as exc:
                        _failure = str(exc)
                        raise KernelCompileError(
                            f"pnex could not build its C++ launcher: {str(exc).strip()[-2000:]}",
                            compiler_log=str(exc),
                        ) from None
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        return _module


def native_wanted() -> bool:
    return os.environ.get("PNEX_LAUNCHER", "native") != "driver" and torch.cuda.is_available()


def available() -> bool:
    """Whether the launcher is built and loaded (does not build it)."""
    return _module is not None


def _spec_dict(definition: KernelDefinition) -> dict[str, Any]:
    spec = definition.spec
    index_of = spec.index_of
    params = []
    for p in spec.params:
        entry: dict[str, Any] = {"name": p.name, "kind": _KINDS[p.role], "init": None}
        if isinstance(p, TensorParam):
            entry.update(
                dtype=p.dtype.name,
                itemsize=p.dtype.itemsize,
                ndim=p.ndim,
                describe=p.shape_text(),
                shape=[None if e is None else e.to_program(index_of) for e in p.shape],
                shape_text=["" if e is None else str(e) for e in p.shape],
                init=None if p.init is None else float(p.init),
            )
        else:
            dtype = p.dtype.name if isinstance(p, ScalarParam) else "int64"
            entry.update(dtype=dtype, itemsize=8, ndim=0, describe=p.describe(), shape=[], shape_text=[])
        params.append(entry)

    def get_image(device_index: int, contiguous: bool) -> tuple[bytes, str]:
        arch = "sm_%d%d" % torch.cuda.get_device_capability(device_index)
        compiled = definition.compiled(arch, layout="C" if contiguous else "A")
        image = compiled.cubin if compiled.cubin is not None else compiled.ptx.encode() + b"\0"
        return image, compiled.entry

    block = list(spec.threads_per_block) + [1] * (3 - len(spec.threads_per_block))
    return {
        "kernel": spec.name,
        "params": params,
        "arguments": [index_of(p.name) for p in spec.arguments],
        "outputs": [index_of(p.name) for p in spec.outputs],
        "n_threads": [e.to_program(index_of) for e in spec.n_threads],
        "n_threads_text": [str(e) for e in spec.n_threads],
        "block": block,
        "get_image": get_image,
    }


def register(definition: KernelDefinition, *, autograd_fallback: bool = True) -> None:
    """Register the op's CUDA kernel (and C++ autograd/inplace fallbacks) with the
    dispatcher through the launcher."""
    module = load_launcher(verbose=definition.options.verbose)
    module.register_op(definition.op_name, _spec_dict(definition), autograd_fallback)


def unregister(definition: KernelDefinition) -> None:
    """Remove a C++ registration left by an earlier definition of the same op name."""
    if _module is not None:
        _module.unregister_op(definition.op_name)


def drop_autograd_fallback(definition: KernelDefinition) -> None:
    if _module is not None:
        _module.drop_autograd_fallback(definition.op_name)
