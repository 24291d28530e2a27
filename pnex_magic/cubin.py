"""What a cubin says about itself: the architecture in its ELF header.

A cubin is an ELF64 file for ``EM_CUDA`` (190) whose ``e_flags`` hold the SM it
was built for.  Two layouts are in use (``e_ident[EI_ABIVERSION]``):

* ABI 7 (CUDA 12 for sm_90 and older): bits 0-7 the SM, bits 16-23 the virtual
  architecture of the PTX (``0x4b054b``: sm_75 from compute_75);
* ABI 8 (CUDA 12 for sm_100 and newer, all of CUDA 13): bits 8-15 the SM
  (``0x6004b04``: sm_75).

pnex hands GPU launchers cubins only (never PTX for the driver to JIT-compile: a
driver older than the NVVM that wrote the PTX cannot compile it, while a cubin
loads on any driver of its CUDA major version and newer); :func:`cubin_arch`
checks that an image is one, and for which architecture.  No dependencies, so
scripts without torch (``benchmarks/cuda12_check.py``) can load this file.
"""

from __future__ import annotations

import struct

__all__ = ["EM_CUDA", "cubin_arch", "cubin_functions", "kernel_entry"]

EM_CUDA = 190
_ELF64 = 2


def cubin_arch(image: bytes) -> str:
    """``"sm_XY"`` from a cubin's ELF header; ``ValueError`` if ``image`` is not a
    64-bit CUDA ELF (PTX text, say)."""
    if len(image) < 52 or image[:4] != b"\x7fELF":
        start = bytes(image[:24]).decode("ascii", "replace").strip()
        raise ValueError(f"not a cubin (no ELF header; it starts {start!r})")
    if image[4] != _ELF64:
        raise ValueError(f"not a cubin (ELF class {image[4]}, expected 64-bit)")
    (machine,) = struct.unpack_from("<H", image, 18)
    if machine != EM_CUDA:
        raise ValueError(f"not a cubin (ELF machine {machine}, expected EM_CUDA = {EM_CUDA})")
    (flags,) = struct.unpack_from("<I", image, 48)
    sm = (flags >> 8) & 0xFF if image[8] >= 8 else flags & 0xFF
    return f"sm_{sm}"


def cubin_functions(image: bytes) -> list[str]:
    """The functions whose code a cubin holds: the names of its ``.text.<name>``
    sections, in section order (``ValueError`` if ``image`` is not a cubin)."""
    cubin_arch(image)  # validates the header
    shoff, = struct.unpack_from("<Q", image, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 58)
    sections = [struct.unpack_from("<IIQQQQ", image, shoff + i * shentsize) for i in range(shnum)]
    strtab_offset, strtab_size = sections[shstrndx][4], sections[shstrndx][5]
    names = bytes(image[strtab_offset:strtab_offset + strtab_size])
    found = []
    for name_offset, *_ in sections:
        end = names.find(b"\0", name_offset)
        name = names[name_offset:end].decode("ascii", "replace")
        if name.startswith(".text."):
            found.append(name[len(".text."):])
    return found


def kernel_entry(image: bytes, expected: str) -> str:
    """The name under which a cubin holds the kernel whose PTX entry was ``expected``:
    that name, or, where the cubin was compiled again from the same function (Numba
    numbers each compile of a function in its mangled name: ``...B2v1B...`` then
    ``...B2v2B...``), the function with the longest name prefix in common."""
    functions = cubin_functions(image)
    if expected in functions or not functions:
        return expected

    def common(name: str) -> int:
        n = 0
        for a, b in zip(name, expected):
            if a != b:
                break
            n += 1
        return n

    return max(functions, key=common)
