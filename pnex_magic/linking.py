"""nvJitLink, through ``cuda.core``'s ``Linker``: PTX and LTO-IR become a cubin for one
GPU architecture (with ptxas's resource report), or one self-contained PTX.

Nothing here needs a GPU, a CUDA driver or Numba: the compile stage
(:mod:`pnex_magic.compiler`) links what NVVM emitted, a saved artifact
(:mod:`pnex_magic.artifact`) links its PTX for every architecture it ships, and a
loaded artifact links its PTX for a GPU it has no cubin for.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from .errors import KernelCompileError

__all__ = [
    "linker_classes",
    "object_code",
    "has_external_calls",
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


_EXTERN_FUNC_RE = re.compile(r"^\s*\.extern\s+\.func\b", re.MULTILINE)

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


def has_external_calls(ptx: str) -> bool:
    """Whether the PTX calls functions it does not contain (to be linked in)."""
    return _EXTERN_FUNC_RE.search(ptx) is not None


_ENTRY_RE = re.compile(r"\.visible\s+\.entry\s+([\w$]+)\(")


def ptx_entry(ptx: str) -> str | None:
    """The name of the PTX's kernel entry (``None`` if it has none)."""
    m = _ENTRY_RE.search(ptx)
    return m.group(1) if m else None


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


def link_ptx(objects: list[Any], arch: str, kernel: str) -> str:
    """Link LTO-IR ``objects`` (a kernel and what it calls) into one PTX for ``arch``
    that calls nothing external, so that it loads on its own."""
    Linker, LinkerOptions, _ = linker_classes()
    linker = Linker(*objects, options=LinkerOptions(arch=arch, link_time_optimization=True, ptx=True))
    try:
        return bytes(linker.link("ptx").code).decode()
    except Exception as exc:
        raise KernelCompileError(
            f"kernel {kernel!r}: nvJitLink could not link its PTX for {arch}: {exc}", compiler_log=str(exc)
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


def _link_error(kernel: str, arch: str, log: str, exc: BaseException) -> KernelCompileError:
    return KernelCompileError(
        f"kernel {kernel!r}: nvJitLink could not build a cubin for {arch}: {log.strip() or exc}",
        compiler_log=log or str(exc),
    )
