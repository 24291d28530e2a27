"""Building pnex's C++ extensions: once per environment, into the cache folder.

``torch.utils.cpp_extension.load`` (ninja and a host C++ compiler; no nvcc)
compiles the sources, one job per translation unit in parallel (``MAX_JOBS`` caps
the jobs; ninja's default is every core plus two), into a folder keyed on every
source and header, the flags, torch, Python and the include folders
(:func:`build_extension`, the PyTorch launcher);
:func:`build_shared_library` compiles a plain shared library for ``ctypes`` the
same way (the XLA FFI handler, which must not link against torch).  A build is
guarded by an ``flock`` that the OS releases when a process dies, and torch's own
lock file, which a killed build leaves behind, is removed under it, so a killed
build never makes the next one hang.  The ninja and compiler processes of a killed
build keep running (they are not its threads): the next build waits for them to
finish rather than write the same files beside them.  A build folder that cannot
be written is a :class:`~pnex_magic.errors.KernelCompileError` that says so.  A
failed build leaves nothing that counts as built: the next attempt compiles again and
shows the compiler's output.  The first build of each extension prints its
progress every few seconds (it takes tens of seconds on two cores).

Once built, an extension is imported straight from its folder: a successful
build records the library's size and modification time next to it, and a later
process whose build key (sources, flags, torch, Python, CUDA headers) finds that
record still true imports the library without ``cpp_extension.load`` (which runs
a compiler and ninja to check that nothing changed, and so needs them installed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..cache import cache_dir
from ..errors import KernelCompileError

__all__ = ["cuda_home", "cuda_include_dir", "cuda_include_dirs", "build_extension", "build_shared_library", "CSRC"]

CSRC = Path(__file__).resolve().parent.parent / "csrc"

log = logging.getLogger(__name__)


def cuda_home() -> str | None:
    """The CUDA toolkit's folder as ``torch.utils.cpp_extension.CUDA_HOME`` finds it
    ($CUDA_HOME, $CUDA_PATH, the folder above ``nvcc`` on the PATH, /usr/local/cuda),
    without importing that module: importing it takes 0.1 s and, with a CUDA build of
    torch on a machine without a GPU, logs "No CUDA runtime is found" to the user."""
    if not (torch.cuda._is_compiled() and torch.version.cuda):
        return None  # what cpp_extension says for a CPU build of torch
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc")
        if nvcc is not None:
            home = os.path.dirname(os.path.dirname(nvcc))
        else:
            home = "/usr/local/cuda" if os.path.exists("/usr/local/cuda") else None
    return home


def _header_dir(component: str, header: str) -> str | None:
    """The first folder holding ``header``: the CUDA toolkit's include folder, else
    the pip wheels' for ``component`` (cuda.pathfinder's name), else /usr/local/cuda's."""
    home = cuda_home()
    candidates = []
    if home:
        toolkit = Path(home) / "include"
        if (toolkit / header).exists():
            return str(toolkit)  # without importing cuda.pathfinder (70 ms on an H200's host)
        candidates.append(toolkit)
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


def cuda_headers(what: str, *, crt: bool = False) -> list[str]:
    """The CUDA header folders an extension named ``what`` builds against: cuda.h's
    and, with ``crt``, the ``crt/`` folder ``cuda_runtime.h`` needs; a clear
    ``KernelCompileError`` saying what to install when they are missing."""
    install = "install the toolkit or pip install 'pnex_magic[cu12]' / 'pnex_magic[cu13]'"
    if not crt:
        base = cuda_include_dir()
        includes = [] if base is None else [base]
    else:
        includes = cuda_include_dirs()
    if not includes:
        raise KernelCompileError(f"pnex's {what} needs the CUDA headers (cuda.h): {install}")
    if crt and not any((Path(d) / _CRT).exists() for d in includes):
        raise KernelCompileError(
            f"pnex's {what} needs the CUDA headers' crt/ folder, which {includes[0]} lacks: {install} "
            f"(nvidia-cuda-nvcc-cu12 / nvidia-cuda-crt)"
        )
    return includes


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


@contextlib.contextmanager
def _build_lock(root: Path, stem: str, key: str, build_dir: Path, what: str) -> Iterator[None]:
    """Hold the build's ``flock`` (released by the OS if this process dies) and clear
    torch's lock file that a killed build left behind, once that build's ninja and
    compiler are done."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        build_dir.mkdir(parents=True, exist_ok=True)
        lock_file = open(root / f"{stem}-{key}.flock", "w")  # noqa: SIM115 -- closed by the with block below
    except OSError as exc:
        raise KernelCompileError(
            f"pnex could not build its {what}: its build folder {build_dir} cannot be written "
            f"({type(exc).__name__}: {exc.strerror or exc}); set PNEX_CACHE_DIR to a writable folder"
        ) from None
    with lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            stale = build_dir / "lock"  # torch's FileBaton, left behind by a killed build
            if stale.exists():
                _wait_for_builders_left_running(build_dir, what)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _builders_left_running(build_dir: Path) -> list[int]:
    """Processes working in ``build_dir`` (torch runs ninja there, and the compiler
    inherits it): what a build whose Python process was killed leaves running."""
    target = os.path.realpath(build_dir)
    found = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc: nothing to wait for that can be seen
        return []
    for pid in pids:
        try:
            if pid != os.getpid() and os.readlink(f"/proc/{pid}/cwd") == target:
                found.append(pid)
        except OSError:
            continue
    return found


def _wait_for_builders_left_running(build_dir: Path, what: str, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    said = False
    while _builders_left_running(build_dir) and time.monotonic() < deadline:
        if not said:
            print(f"pnex: waiting for the {what} build that a killed process left running...", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.2)


def _stamp(library: Path) -> dict[str, Any]:
    st = library.stat()
    return {"library": library.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _record_build(name: str, build_dir: Path) -> None:
    libraries = sorted(build_dir.glob(f"{name}*.so"))
    if libraries:
        (build_dir / f"{name}.built.json").write_text(json.dumps(_stamp(libraries[0])))


def _import_built(name: str, build_dir: Path) -> Any | None:
    """The extension ``name``, imported from ``build_dir`` if a recorded build is
    there and its library unchanged since; ``None`` otherwise."""
    try:
        recorded = json.loads((build_dir / f"{name}.built.json").read_text())
        library = build_dir / str(recorded["library"])
        if _stamp(library) != recorded:
            return None
        spec = importlib.util.spec_from_file_location(name, library)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        log.debug("pnex: importing the built %s failed (%s); building it", name, exc)
        return None


def build_extension(
    stem: str,
    sources: Sequence[Path],
    *,
    includes: Sequence[str],
    cflags: Sequence[str] = ("-O2",),
    ldflags: Sequence[str] = (),
    headers: Sequence[Path] = (),
    what: str,
    verbose: bool = False,
    built_only: bool = False,
) -> Any:
    """Build (first time) and import the extension ``stem`` from ``sources``, its
    translation units (which include ``headers``; all of them are part of the build
    key); ``what`` names it in progress lines and errors ("C++ launcher").  ``built_only``: import it if it is built, else
    return ``None`` (build nothing)."""
    key = build_key([*sources, *headers], includes, [*cflags, *ldflags])
    root = cache_dir() / "launcher"
    build_dir = root / (key if stem == "pnex_launcher" else f"{stem}-{key}")
    name = f"{stem}_{key}"
    module = _import_built(name, build_dir)
    if module is not None or built_only:
        return module
    # Only a build needs cpp_extension: importing it imports setuptools (0.4 s on a
    # machine whose site-packages hold no bytecode, as measured on the GPU image).
    from torch.utils import cpp_extension

    with _build_lock(root, stem, key, build_dir, what):
        built = any(build_dir.glob(f"{name}*.so"))
        ctx = contextlib.nullcontext() if built else progress(f"building the {what}")
        with ctx:
            try:
                module = cpp_extension.load(
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
        with contextlib.suppress(OSError):
            _record_build(name, build_dir)
        return module


def build_shared_library(
    stem: str,
    sources: Sequence[Path],
    *,
    includes: Sequence[str],
    headers: Sequence[Path] = (),
    cflags: Sequence[str] = ("-O2",),
    ldflags: Sequence[str] = (),
    key_extra: str = "",
    what: str,
    verbose: bool = False,
) -> Path:
    """Build (first time) a plain shared library ``lib<stem>.so`` from ``sources`` with
    the host C++ compiler (``$CXX``, else ``c++``), for ``ctypes``; returns its path.
    ``headers`` (pnex's own, next to the sources) and ``key_extra`` (e.g. the version of
    the package whose headers are included) join the build key."""
    compiler = os.environ.get("CXX") or "c++"
    key = build_key([*sources, *headers], includes, [compiler, *cflags, *ldflags, key_extra])
    root = cache_dir() / "launcher"
    build_dir = root / f"{stem}-{key}"
    library = build_dir / f"lib{stem}.so"
    with _build_lock(root, stem, key, build_dir, what):
        if library.exists():
            return library
        # Renamed when complete: a killed build leaves no library.  Per process: the
        # compiler of a killed build keeps running and must not write this build's file.
        partial = build_dir / f"lib{stem}.so.partial-{os.getpid()}"
        command = [
            compiler, "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", *cflags,
            *(f"-I{i}" for i in includes), *(str(s) for s in sources), "-o", str(partial), *ldflags,
        ]
        with progress(f"building the {what}"):
            if verbose:
                print(" ".join(command), file=sys.stderr)
            try:
                done = subprocess.run(command, capture_output=True, text=True)
            except OSError as exc:
                raise KernelCompileError(
                    f"pnex could not build its {what}: no C++ compiler ({compiler}: {exc.strerror}); install g++ "
                    f"or set $CXX"
                ) from None
            if done.returncode != 0:
                log = f"{' '.join(command)}\n{done.stdout}{done.stderr}"
                raise KernelCompileError(
                    f"pnex could not build its {what}: {done.stderr.strip()[-2000:]}", compiler_log=log
                )
        partial.replace(library)
        return library
