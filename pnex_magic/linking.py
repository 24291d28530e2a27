"""nvJitLink, through ``cuda.core``'s ``Linker``: PTX and LTO-IR become a cubin for one
GPU architecture (with ptxas's resource report), or one self-contained PTX.

Nothing here needs a GPU, a CUDA driver or Numba: the compile stage
(:mod:`pnex_magic.compiler`) links what NVVM emitted, a saved artifact
(:mod:`pnex_magic.artifact`) links its PTX for every architecture it ships, and a
loaded artifact links its PTX for a GPU it has no cubin for.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
from pathlib import Path
from typing import Any

from .errors import KernelCompileError

__all__ = [
    "linker_classes",
    "object_code",
    "has_external_calls",
    "uses_grid_sync",
    "device_runtime",
    "ptx_entry",
    "link_cubin",
    "link_ptx",
    "probe_linker",
    "link_ptx_direct",
]


def linker_classes():
    try:
        from cuda.core import Linker, LinkerOptions, ObjectCode
    except ImportError:
        from cuda.core.experimental import Linker, LinkerOptions, ObjectCode  # older cuda-core
    return Linker, LinkerOptions, ObjectCode


# An external function the PTX declares: ".extern .func (.param .b64 func_retval0) name(" or
# ".extern .func name(".
_EXTERN_FUNC_RE = re.compile(r"^\s*\.extern\s+\.func\s+(?:\([^)]*\)\s*)?([\w$]+)", re.MULTILINE)
# What Numba's cooperative groups call (cuda.cg.this_grid() and its sync()): functions of
# CUDA's device runtime library, libcudadevrt.a, which numba-cuda's own linker adds for
# them (codegen.py, needs_cudadevrt); a kernel that calls them needs a cooperative launch.
_DEVICE_RUNTIME_PREFIX = "cudaCG"

_LINKABLE_KINDS = {
    "PTXSource": "from_ptx",
    "Cubin": "from_cubin",
    "Fatbin": "from_fatbin",
    "Object": "from_object",
    "Archive": "from_library",
    "LTOIR": "from_ltoir",
}


def object_code(code: Any, kernel: str) -> Any:
    """A ``cuda.core`` ``ObjectCode`` for one of ``cuda.compile_all``'s extra outputs."""
    _, _, ObjectCode = linker_classes()
    if isinstance(code, ObjectCode):
        return code
    factory = _LINKABLE_KINDS.get(type(code).__name__)
    data = getattr(code, "data", None)
    if factory is None or data is None:
        raise KernelCompileError(f"kernel {kernel!r}: cannot link {code!r} into the kernel's cubin")
    if isinstance(data, str):
        data = data.encode()
    return getattr(ObjectCode, factory)(data)


def _external_functions(ptx: str) -> list[str]:
    return _EXTERN_FUNC_RE.findall(ptx)


def has_external_calls(ptx: str) -> bool:
    """Whether the PTX calls functions it does not contain, other than the device
    runtime's (:func:`uses_grid_sync`): code compiled beside the kernel (float16/bfloat16
    operators, ``declare_device`` functions) that must be linked in."""
    return any(not name.startswith(_DEVICE_RUNTIME_PREFIX) for name in _external_functions(ptx))


def uses_grid_sync(ptx: str) -> bool:
    """Whether the PTX calls CUDA's cooperative groups (``cuda.cg.this_grid()``,
    ``grid.sync()``): its cubin links CUDA's device runtime (:func:`device_runtime`)
    and it must be launched cooperatively, with its whole grid resident at once."""
    return any(name.startswith(_DEVICE_RUNTIME_PREFIX) for name in _external_functions(ptx))


# libcudadevrt.a in the CUDA runtime wheels, by nvJitLink's major version: an archive from
# a newer CUDA than the linker's cannot be linked by it.
_DEVICE_RUNTIME_WHEELS = {13: ("nvidia", "cu13", "lib"), 12: ("nvidia", "cuda_runtime", "lib")}
_DEVICE_RUNTIME_FILE = "libcudadevrt.a"


@functools.lru_cache(maxsize=1)
def device_runtime() -> tuple[bytes, str]:
    """CUDA's device runtime library (``libcudadevrt.a``) for the nvJitLink in use, and
    where it was found: from the CUDA runtime wheel of nvJitLink's major version
    (``nvidia-cuda-runtime`` 13.x ships ``nvidia/cu13/lib/libcudadevrt.a``,
    ``nvidia-cuda-runtime-cu12`` ``nvidia/cuda_runtime/lib/libcudadevrt.a``; the
    ``cu13`` and ``cu12`` extras install them) on ``sys.path``, else a CUDA toolkit's
    (``cuda.pathfinder``: ``$CUDA_HOME``, ``$CUDA_PATH``, conda).  Raises
    :class:`KernelCompileError` where there is none."""
    major = None
    try:
        from cuda.bindings import nvjitlink

        major = nvjitlink.version()[0]
    except Exception:  # no nvJitLink bindings: any wheel's archive, newest first
        pass
    wheels = [_DEVICE_RUNTIME_WHEELS[major]] if major in _DEVICE_RUNTIME_WHEELS else [
        _DEVICE_RUNTIME_WHEELS[m] for m in sorted(_DEVICE_RUNTIME_WHEELS, reverse=True)
    ]
    for parts in wheels:
        for root in sys.path:
            path = Path(root or ".", *parts, _DEVICE_RUNTIME_FILE)
            if path.is_file():
                return path.read_bytes(), str(path)
    try:
        from cuda.pathfinder import find_static_lib

        path = Path(find_static_lib("cudadevrt"))
        return path.read_bytes(), str(path)
    except Exception as exc:  # not found, or a cuda-pathfinder without find_static_lib
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    wheel = "nvidia-cuda-runtime-cu12" if major == 12 else "nvidia-cuda-runtime (13.x)"
    raise KernelCompileError(
        f"a kernel that synchronises its grid (cuda.cg.this_grid().sync()) links CUDA's device runtime "
        f"library, {_DEVICE_RUNTIME_FILE}, which was not found ({why}). Install the CUDA runtime wheel of "
        f"your nvJitLink, {wheel} (the pnex_magic[cu13] and [cu12] extras bring it), or set CUDA_HOME to a "
        f"CUDA toolkit"
    )


_ENTRY_RE = re.compile(r"\.visible\s+\.entry\s+([\w$]+)\(")


def ptx_entry(ptx: str) -> str | None:
    """The name of the PTX's kernel entry (``None`` if it has none)."""
    m = _ENTRY_RE.search(ptx)
    return m.group(1) if m else None


# Instructions only the architecture-specific targets have (sm_90a: Hopper's warpgroup matrix
# multiply and register reallocation), as they appear in PTX.
_ARCH_SPECIFIC_RE = re.compile(r"^\s*(?:wgmma\.|setmaxnreg\.)", re.MULTILINE)


def arch_specific(ptx: str, arch: str) -> tuple[str, str]:
    """(PTX, architecture) to link: Numba targets ``sm_90``, but ``wgmma`` and
    ``setmaxnreg`` exist only for ``sm_90a``, whose cubins run on sm_90 GPUs alone (every
    H100 and H200).  PTX that uses them is retargeted; any other is returned as is."""
    if arch == "sm_90" and _ARCH_SPECIFIC_RE.search(ptx):
        return re.sub(r"^\.target\s+sm_90\b", ".target sm_90a", ptx, count=1, flags=re.MULTILINE), "sm_90a"
    return ptx, arch


def link_cubin(
    ptx: str, arch: str, max_registers: int | None, kernel: str, dependencies: list[Any] | tuple = ()
) -> tuple[bytes, str]:
    """Assemble PTX (and the code it links against) into a cubin with nvJitLink;
    returns (cubin, info log)."""
    Linker, LinkerOptions, ObjectCode = linker_classes()
    options = {"arch": arch, "verbose": True, "lineinfo": True}  # keep the PTX's line table in the cubin
    if max_registers:
        options["max_register_count"] = int(max_registers)
    if any(getattr(dep, "code_type", None) == "ltoir" for dep in dependencies):
        options["link_time_optimization"] = True
    dependencies = list(dependencies)
    if uses_grid_sync(ptx):
        dependencies.append(ObjectCode.from_library(device_runtime()[0]))
    linker = Linker(ObjectCode.from_ptx(ptx.encode()), *dependencies, options=LinkerOptions(**options))
    try:
        cubin = linker.link("cubin")
    except Exception as exc:
        log = ""
        try:
            log = linker.get_error_log()
        except Exception:
            pass
        raise _link_error(kernel, arch, log, exc) from None
    return bytes(cubin.code), linker.get_info_log()


def link_lto_cubin(objects: list[Any], arch: str, max_registers: int | None, kernel: str) -> tuple[bytes, str]:
    """Link LTO-IR ``objects`` (the kernel first) into a cubin, optimised as one program.
    For ``wgmma`` kernels: from PTX, nvJitLink assembles a relocatable object, and ptxas
    then serialises every ``wgmma`` ("C7509: ... serialized due to the presence of Extern
    calls"), waiting for each before the next; from LTO-IR it compiles the whole program
    and keeps them in flight."""
    Linker, LinkerOptions, _ = linker_classes()
    options: dict[str, Any] = {"arch": arch, "verbose": True, "link_time_optimization": True, "lineinfo": True}
    if max_registers:
        options["max_register_count"] = int(max_registers)
    linker = Linker(*objects, options=LinkerOptions(**options))
    try:
        cubin = linker.link("cubin")
    except Exception as exc:
        log = ""
        try:
            log = linker.get_error_log()
        except Exception:
            pass
        raise _link_error(kernel, arch, log, exc) from None
    return bytes(cubin.code), linker.get_info_log()


def link_ptx(objects: list[Any], arch: str, kernel: str) -> str:
    """Link LTO-IR ``objects`` (a kernel and what it calls) into one PTX for ``arch``
    that calls nothing external, so that it loads on its own."""
    Linker, LinkerOptions, _ = linker_classes()
    linker = Linker(*objects, options=LinkerOptions(arch=arch, link_time_optimization=True, ptx=True))
    try:
        return bytes(linker.link("ptx").code).decode()
    except Exception as exc:
        raise KernelCompileError(
            f"kernel {kernel!r}: nvJitLink could not link its PTX for {arch}: {_printable(str(exc))}",
            compiler_log=_printable(str(exc)),
        ) from None


_PROBE_PTX = """.version 7.0
.target sm_75
.address_size 64
.visible .entry pnex_probe()
{
\tret;
}
"""


def probe_linker() -> None:
    """Link a trivial kernel with nvJitLink; raises if the linker is unusable here."""
    link_cubin(_PROBE_PTX, "sm_75", None, "pnex_probe")


def link_ptx_direct(ptx: str, arch: str, max_registers: int | None, kernel: str) -> bytes:
    """A cubin of self-contained PTX for ``arch`` through ``cuda.bindings.nvjitlink``
    alone.  What a loaded artifact uses for a GPU it has no cubin for: unlike
    ``cuda.core`` (whose import brings the NVVM and NVRTC bindings), it loads nothing
    but nvJitLink."""
    nvjitlink = importlib.import_module("cuda.bindings.nvjitlink")  # ImportError where the wheel is absent
    options = [f"-arch={arch}", "-lineinfo"] + ([f"-maxrregcount={int(max_registers)}"] if max_registers else [])
    handle = nvjitlink.create(len(options), options)
    try:
        data = ptx.encode()
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), f"{kernel}.ptx")
            if uses_grid_sync(ptx):
                library, _ = device_runtime()
                nvjitlink.add_data(handle, nvjitlink.InputType.LIBRARY, library, len(library), _DEVICE_RUNTIME_FILE)
            nvjitlink.complete(handle)
        except Exception as exc:
            log = ""
            try:
                size = nvjitlink.get_error_log_size(handle)
                buf = bytearray(size)
                nvjitlink.get_error_log(handle, buf)
                log = bytes(buf).rstrip(b"\0").decode(errors="replace")
            except Exception:
                pass
            raise _link_error(kernel, arch, log, exc) from None
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    finally:
        nvjitlink.destroy(handle)


_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _printable(text: str) -> str:
    """A linker's log or message as text: nvJitLink's logs are C strings that may end in
    NUL bytes (and carry other control characters), which have no place in a message."""
    return _CONTROL_RE.sub("", text).strip()


def _link_error(kernel: str, arch: str, log: str, exc: BaseException) -> KernelCompileError:
    log = _printable(log or "")
    return KernelCompileError(
        f"kernel {kernel!r}: nvJitLink could not build a cubin for {arch}: {log or _printable(str(exc))}",
        compiler_log=log or _printable(str(exc)),
    )
