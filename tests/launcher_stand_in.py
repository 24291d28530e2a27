"""The C++ launcher on a machine without CUDA, for tests of its registration.

The CPU build of torch lacks two things the launcher's build needs: the header
``c10/cuda/impl/cuda_cmake_macros.h`` (a CUDA build of torch generates it; one line)
and ``libc10_cuda.so`` with the CUDA runtime functions c10's CUDA headers call.
With a stand-in for each, the real launcher builds here and imports: its dispatcher
registrations, its autograd kernels and the op class's call slot work on CPU
tensors, while nothing in it that needs CUDA is ever reached (no CUDA tensor
exists).  The stand-in library defines every such symbol the built launcher needs
(found with ``nm``), each one aborting if called.

:func:`use` sets this up in the calling process (a test's subprocess): the launcher
is wanted (as on a GPU machine), its builds get the stand-ins, and the stand-in
library is loaded before the launcher is imported.  The build process that
:mod:`pnex_magic.launch.background` starts needs the same (it imports what it
built): :func:`environment` gives a subprocess's environment in which every Python
process, build processes included, calls :func:`use` at start-up (through a
``sitecustomize`` module).  ``benchmarks/launcher_build.py`` times builds with the
same stand-ins.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import threading
from pathlib import Path

__all__ = ["stand_ins", "stub_library", "use", "environment"]

MACROS = "c10/cuda/impl/cuda_cmake_macros.h"


def stand_ins(folder: Path, torch_include: Path, torch_lib: Path) -> tuple[list[str], list[str]]:
    """Include folders and linker flags that make the CPU build of torch compile and link
    the launcher (nothing where torch is a CUDA build)."""
    includes, ldflags = [], []
    if not (torch_include / MACROS).exists():
        header = folder / "include" / MACROS
        if not header.exists():
            _in_place(header, lambda partial: partial.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"))
        includes.append(str(folder / "include"))
    if not (torch_lib / "libc10_cuda.so").exists():
        library = folder / "lib" / "libc10_cuda.so"
        if not library.exists():
            _in_place(library, lambda partial: subprocess.run(
                ["c++", "-shared", "-o", str(partial), "-x", "c++", "/dev/null"], check=True))
        ldflags.append(f"-L{library.parent}")
    return includes, ldflags


def _in_place(path: Path, make) -> None:
    """Make ``path`` with ``make(partial)`` under a name of this process's, then rename
    it into place: every Python process of a test (its build processes too) sets the
    stand-ins up at start-up, several at once, and one must never read (compile
    against, link, load) a file that another is writing (seen as a switch that failed
    with "does not load" while the two-process test ran under load)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        make(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _missing(library: Path) -> list[str]:
    """The symbols ``library`` needs from libc10_cuda and the CUDA runtime."""
    names = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True,
                           check=True).stdout.split()
    names = [n for n in names if n not in ("U", "w", "v")]
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                               check=True).stdout.splitlines()
    return [n for n, d in zip(names, demangled) if d.startswith("c10::cuda::") or re.match(r"cuda[A-Z]", n)]


def stub_library(library: Path, folder: Path) -> Path:
    """A ``libc10_cuda.so`` that defines every symbol ``library`` needs from libc10_cuda
    and the CUDA runtime, each aborting if called."""
    out = folder / "libc10_cuda.so"
    if out.exists():  # made for this library by another process (renamed into place whole)
        return out
    symbols = _missing(library)
    source = ["#include <cstdlib>"]
    for i, name in enumerate(symbols):
        source.append(f'extern "C" void pnex_stand_in_{i}() __asm__("{name}");')
        source.append(f'void pnex_stand_in_{i}() {{ std::abort(); }}')

    def make(partial: Path) -> None:
        cpp = partial.with_name(partial.name + ".cpp")
        try:
            cpp.write_text("\n".join(source) + "\n")
            subprocess.run(["c++", "-shared", "-fPIC", "-Wl,-soname,libc10_cuda.so", str(cpp), "-o", str(partial)],
                           check=True)
        finally:
            cpp.unlink(missing_ok=True)

    _in_place(out, make)
    return out


def use(folder: Path, broken: bool = False) -> None:
    """In this process: the C++ launcher is wanted as on a GPU machine, built with the
    stand-ins kept in ``folder``, and imported after the stand-in library is loaded;
    ``broken``: its build fails, at ``c10/cuda/impl/cuda_cmake_macros.h``, with a CPU or
    a CUDA build of torch alike (an include folder of the build, searched before torch's,
    holds one that is an ``#error``; building without the stand-ins failed with a CPU
    build only, and a CUDA build of torch loaded the "broken" launcher)."""
    import torch

    from pnex_magic.launch import build, native

    native.native_wanted = lambda: True
    if broken:
        header = folder / "broken-include" / MACROS
        if not header.exists():
            _in_place(header, lambda partial: partial.write_text('#error "pnex test: a launcher build that fails"\n'))
        cuda_headers = build.cuda_headers
        build.cuda_headers = lambda what, crt=False: [*cuda_headers(what, crt=crt), str(folder / "broken-include")]
        return
    torch_dir = Path(torch.__file__).parent
    includes, ldflags = stand_ins(folder, torch_dir / "include", torch_dir / "lib")
    cuda_headers = build.cuda_headers
    native_ldflags = native._ldflags
    build.cuda_headers = lambda what, crt=False: [*cuda_headers(what, crt=crt), *includes]
    native._ldflags = lambda: [*ldflags, *native_ldflags()]
    import_library = build.import_library

    def with_stub(name: str, library: Path):
        stub = stub_library(library, folder / f"stub-{library.stat().st_mtime_ns}")
        ctypes.CDLL(str(stub), mode=ctypes.RTLD_GLOBAL)
        return import_library(name, library)

    build.import_library = with_stub
    compile_into = build.compile_into

    def compile_then_stub(target, into: Path):
        try:
            return compile_into(target, into)
        except Exception as exc:  # the build's own import failed for want of the stand-in library
            if "undefined symbol" not in str(exc):
                raise
            [library] = into.glob(f"{target.name}*.so")
            ctypes.CDLL(str(stub_library(library, folder / f"stub-{library.stat().st_mtime_ns}")), mode=ctypes.RTLD_GLOBAL)
            return compile_into(target, into)  # built already: imports it now

    build.compile_into = compile_then_stub
    from pnex_magic.launch import background

    background.compile_into = compile_then_stub


SITE = """
import os, sys
if os.environ.get("PNEX_TEST_STAND_IN"):
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    import launcher_stand_in
    launcher_stand_in.use(Path(os.environ["PNEX_TEST_STAND_IN"]), broken=bool(os.environ.get("PNEX_TEST_STAND_IN_BROKEN")))
"""


def environment(env: dict, folder: Path) -> dict:
    """``env`` for a subprocess in which every Python process (build processes included)
    runs :func:`use` with the stand-ins kept in ``folder`` (and ``broken`` where
    ``PNEX_TEST_STAND_IN_BROKEN`` is set)."""
    site = folder / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE.format(tests=str(Path(__file__).resolve().parent)))
    path = [str(site), env.get("PYTHONPATH", "")]
    return dict(env, PNEX_TEST_STAND_IN=str(folder), PYTHONPATH=":".join(p for p in path if p))
