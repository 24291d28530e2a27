"""What pnex's C++ extensions are built from, and compiling one into a folder.

A :class:`Build` names everything a build depends on: its sources and headers, the
include folders, the flags, the host compiler, torch and Python.  Its key (a hash
of all of it) names its folder under the cache folder's ``launcher/``.  Two kinds:

* ``"extension"``: a torch C++ extension (the PyTorch launcher), compiled by
  ``torch.utils.cpp_extension.load`` (ninja and the host compiler; no nvcc), one
  job per translation unit in parallel, and imported as a Python module;
* ``"library"``: a plain shared library for ``ctypes`` (the XLA FFI handler, which
  must not link against torch), one compiler command.

:func:`compile_into` compiles a build into a given folder and checks that the result
loads.  It is what a build process runs: :mod:`.background` runs it once per
environment, in a process of its own, into a temporary folder that is renamed into
place.  Once built, an extension is imported straight from its folder: a build
records the library's size and modification time next to it (:func:`record_build`),
and a later process whose build finds that record still true imports the library
without ``cpp_extension.load`` (which runs a compiler and ninja to check that nothing
changed, and so needs them installed).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..cache import folder as cache_folder
from ..errors import KernelCompileError

__all__ = [
    "cuda_home", "cuda_include_dir", "cuda_include_dirs", "cuda_headers", "compiler", "toolchain", "build_key", "Build",
    "compile_into", "record_build", "built_library", "import_built", "import_library", "CSRC",
]

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


def compiler() -> str:
    """The host C++ compiler a build runs (``$CXX``, else ``c++``), as torch's
    ``cpp_extension`` picks it."""
    return os.environ.get("CXX") or "c++"


def _ninja() -> str | None:
    found = shutil.which("ninja")
    if found is None:
        try:  # the ninja wheel (a dependency of pnex_magic) puts it beside its module
            import ninja

            found = str(Path(ninja.BIN_DIR) / "ninja")
        except (ImportError, AttributeError):
            return None
    return found if os.path.exists(found) else None


def toolchain() -> dict[str, Any]:
    """What a build needs besides its inputs, as found now: the compiler's path and
    modification time (``None``: not installed) and ninja's path.  A failed build is
    tried again once this changes (a compiler installed or upgraded)."""
    found = shutil.which(compiler())
    mtime = None
    if found is not None:
        try:
            mtime = os.stat(found).st_mtime_ns
        except OSError:
            found = None
    return {"compiler": found, "compiler_mtime": mtime, "ninja": _ninja()}


def build_key(sources: Sequence[Path], includes: Sequence[str], flags: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for source in sources:
        h.update(Path(source).read_bytes())
    h.update(f"{torch.__version__}|{torch.version.cuda}|{sys.version}|{'|'.join(includes)}|{' '.join(flags)}".encode())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Build:
    """One build: its kind (``"extension"`` or ``"library"``), what it is built from,
    and ``what`` it is for messages ("C++ launcher").  Plain data, so that a build
    process gets it as JSON (:meth:`to_json`)."""

    stem: str
    kind: str
    what: str
    sources: tuple[str, ...]
    includes: tuple[str, ...] = ()
    cflags: tuple[str, ...] = ("-O2",)
    ldflags: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    key_extra: str = ""
    verbose: bool = False

    @functools.cached_property
    def key(self) -> str:
        """A hash of the sources, headers, include folders, flags, compiler, torch and Python."""
        flags = [*self.cflags, *self.ldflags]
        if self.kind == "library":
            flags = [compiler(), *flags, self.key_extra]
        return build_key([Path(s) for s in (*self.sources, *self.headers)], self.includes, flags)

    @property
    def folder(self) -> Path:
        root = cache_folder("launcher")
        return root / (self.key if self.stem == "pnex_launcher" else f"{self.stem}-{self.key}")

    @property
    def name(self) -> str:
        """The extension's module name (its library is ``<name>*.so``)."""
        return f"{self.stem}_{self.key}"

    @property
    def record_name(self) -> str:
        """What its library's name starts with: the module name, or ``lib<stem>``."""
        return self.name if self.kind == "extension" else f"lib{self.stem}"

    def built(self) -> Path | None:
        """Its library, if a whole build of it is in its folder (:func:`built_library`)."""
        return built_library(self.record_name, self.folder)

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @classmethod
    def from_json(cls, text: str) -> "Build":
        data = json.loads(text)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def compile_into(build: Build, folder: Path) -> Path:
    """Compile ``build`` into ``folder`` and check that the result loads; returns the
    library.  A failure is a :class:`~pnex_magic.errors.KernelCompileError` whose
    ``compiler_log`` holds the compiler's whole output."""
    folder.mkdir(parents=True, exist_ok=True)
    if build.kind == "library":
        return _compile_library(build, folder)
    # Only a build needs cpp_extension: importing it imports setuptools (0.4 s on a
    # machine whose site-packages hold no bytecode, as measured on the GPU image).
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(  # compiles, links and imports it (in the build process)
            name=build.name,
            sources=list(build.sources),
            extra_include_paths=list(build.includes),
            extra_cflags=list(build.cflags),
            extra_ldflags=list(build.ldflags),
            build_directory=str(folder),
            with_cuda=False,
            verbose=build.verbose,
        )
    except Exception as exc:
        raise KernelCompileError(
            f"pnex could not build its {build.what}: {str(exc).strip()[-2000:]}", compiler_log=str(exc)
        ) from None
    record_build(build.name, folder)
    return next(iter(sorted(folder.glob(f"{build.name}*.so"))))


def _compile_library(build: Build, folder: Path) -> Path:
    library = folder / f"lib{build.stem}.so"
    command = [
        compiler(), "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", *build.cflags,
        *(f"-I{i}" for i in build.includes), *build.sources, "-o", str(library), *build.ldflags,
    ]
    if build.verbose:
        print(" ".join(command), file=sys.stderr)
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        raise KernelCompileError(
            f"pnex could not build its {build.what}: no C++ compiler ({compiler()}: {exc.strerror}); install g++ "
            f"or set $CXX"
        ) from None
    if done.returncode != 0:
        raise KernelCompileError(
            f"pnex could not build its {build.what}: {done.stderr.strip()[-2000:]}",
            compiler_log=f"{' '.join(command)}\n{done.stdout}{done.stderr}",
        )
    try:
        ctypes.CDLL(str(library))  # it loads (its symbols resolve) in this process
    except OSError as exc:
        raise KernelCompileError(f"pnex built its {build.what}, but it does not load: {exc}", compiler_log=str(exc)) from None
    record_build(build.record_name, folder)
    return library


def _stamp(library: Path) -> dict[str, Any]:
    st = library.stat()
    return {"library": library.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def record_build(name: str, folder: Path) -> None:
    """Record the library built in ``folder`` (``<name>*.so``): its size and time."""
    libraries = sorted(folder.glob(f"{name}*.so"))
    if libraries:
        (folder / f"{name}.built.json").write_text(json.dumps(_stamp(libraries[0])))



def built_library(name: str, folder: Path) -> Path | None:
    """The library a recorded build left in ``folder``, if it is unchanged since."""
    try:
        recorded = json.loads((folder / f"{name}.built.json").read_text())
        library = folder / str(recorded["library"])
        return library if _stamp(library) == recorded else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def import_built(name: str, folder: Path) -> Any | None:
    """The extension ``name``, imported from ``folder`` if a recorded build is there
    and its library unchanged since; ``None`` otherwise."""
    library = built_library(name, folder)
    return None if library is None else import_library(name, library)


def import_library(name: str, library: Path) -> Any | None:
    """The extension module ``name`` from the file ``library`` (``None`` if it does not import)."""
    try:
        spec = importlib.util.spec_from_file_location(name, library)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (OSError, ImportError) as exc:
        log.debug("pnex: importing the built %s failed (%s)", name, exc)
        return None

