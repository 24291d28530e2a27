"""Building pnex's C++ extensions: once per environment, into the cache folder.

``torch.utils.cpp_extension.load`` (ninja and a host C++ compiler; no nvcc)
compiles a source into a folder keyed on the source, torch, Python and the
include folders.  A build is guarded by an ``flock`` that the OS releases when a
process dies, and torch's own lock file, which a killed build leaves behind, is
removed under it, so a killed build never makes the next one hang.  A failed
build leaves nothing that counts as built: the next attempt compiles again and
shows the compiler's output.  The first build of each extension prints its
progress every few seconds (it takes tens of seconds on two cores).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..cache import cache_dir
from ..errors import KernelCompileError

__all__ = ["cuda_include_dir", "cuda_include_dirs", "build_extension", "CSRC"]

CSRC = Path(__file__).resolve().parent.parent / "csrc"


def _header_dir(component: str, header: str) -> str | None:
    """The first folder holding ``header``: the CUDA toolkit's include folder, else
    the pip wheels' for ``component`` (cuda.pathfinder's name), else /usr/local/cuda's."""
    from torch.utils.cpp_extension import CUDA_HOME

    candidates = []
    if CUDA_HOME:
        candidates.append(Path(CUDA_HOME) / "include")
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory(component)
        if found:
            candidates.append(Path(found))
    except Exception:
        pass
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / header).exists():
            return str(c)
    return None


def cuda_include_dir() -> str | None:
    """A folder holding cuda.h: the CUDA toolkit's, else the pip wheels'."""
    return _header_dir("cudart", "cuda.h")


def cuda_include_dirs() -> list[str]:
    """The folders the C++ launcher's CUDA headers need: the one holding cuda.h and, if
    that lacks them, the one holding ``crt/`` (which ``cuda_runtime.h`` includes; the
    CUDA 12 wheels keep it in nvidia-cuda-nvcc-cu12, the CUDA 13 ones in
    nvidia-cuda-crt).  Empty without cuda.h; without ``crt/``, only cuda.h's folder."""
    base = cuda_include_dir()
    if base is None:
        return []
    if (Path(base) / _CRT).exists():
        return [base]
    crt = _header_dir("nvcc", _CRT)
    return [base] if crt is None else [base, crt]


_CRT = "crt/host_config.h"


def build_key(sources: Sequence[Path], includes: Sequence[str], flags: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for source in sources:
        h.update(source.read_bytes())
    h.update(f"{torch.__version__}|{torch.version.cuda}|{sys.version}|{'|'.join(includes)}|{' '.join(flags)}".encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def progress(message: str):
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


def build_extension(
    stem: str,
    sources: Sequence[Path],
    *,
    includes: Sequence[str],
    cflags: Sequence[str] = ("-O2",),
    ldflags: Sequence[str] = (),
    what: str,
    verbose: bool = False,
) -> Any:
    """Build (first time) and import the extension ``stem`` from ``sources``; ``what``
    names it in progress lines and errors ("C++ launcher")."""
    from torch.utils import cpp_extension

    key = build_key(sources, includes, [*cflags, *ldflags])
    root = cache_dir() / "launcher"
    build_dir = root / (key if stem == "pnex_launcher" else f"{stem}-{key}")
    build_dir.mkdir(parents=True, exist_ok=True)
    lock_path = root / f"{stem}-{key}.flock"
    name = f"{stem}_{key}"
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released by the OS if this process dies
        try:
            stale = build_dir / "lock"  # torch's FileBaton, left behind by a killed build
            if stale.exists():
                stale.unlink()
            built = any(build_dir.glob(f"{name}*.so"))
            ctx = contextlib.nullcontext() if built else progress(f"building the {what}")
            with ctx:
                try:
                    return cpp_extension.load(
                        name=name,
                        sources=[str(s) for s in sources],
                        extra_include_paths=list(includes),
                        extra_cflags=list(cflags),
                        extra_ldflags=list(ldflags),
                        build_directory=str(build_dir),
                        with_cuda=False,
                        verbose=verbose,
                    )
                except Exception as exc:
                    raise KernelCompileError(
                        f"pnex could not build its {what}: {str(exc).strip()[-2000:]}",
                        compiler_log=str(exc),
                    ) from None
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
