"""GPU architectures: spellings (``"sm_90"``, ``(9, 0)``, ``"9.0"``) and the one a
kernel is compiled for when none is named."""

from __future__ import annotations

import os
import re

from .errors import KernelDefinitionError

__all__ = ["DEFAULT_ARCH", "parse_arch", "arch_name", "default_arch", "default_is_stand_in"]

DEFAULT_ARCH = "sm_75"  # the oldest architecture CUDA 13 targets; Colab's T4


def parse_arch(arch: str | tuple[int, int] | int) -> tuple[int, int]:
    """``"sm_90"``, ``"90"``, ``90``, ``(9, 0)``, ``"9.0"`` → ``(9, 0)``."""
    if isinstance(arch, tuple) and len(arch) == 2:
        return int(arch[0]), int(arch[1])
    text = str(arch).strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)(a|f)?", text)
    if m:
        digits = m.group(1)
        return int(digits[:-1]), int(digits[-1])
    m = re.fullmatch(r"(\d+)\.(\d+)", text)
    if m:
        return int(m.group(1)), int(m.group(2))
    raise KernelDefinitionError(f"unknown GPU architecture {arch!r}; expected e.g. 'sm_90', (9, 0) or '9.0'")


def arch_name(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def default_arch() -> str:
    """The architecture to compile for: ``$PNEX_ARCH``, else the current GPU's,
    else ``sm_75``."""
    return _default()[0]


def default_is_stand_in() -> bool:
    """Whether :func:`default_arch` is a stand-in (no ``$PNEX_ARCH`` and no GPU): a
    kernel that needs a newer architecture may then be compiled for that one."""
    return _default()[1]


def _default() -> tuple[str, bool]:
    env = os.environ.get("PNEX_ARCH")
    if env:
        return arch_name(parse_arch(env)), False
    try:
        import torch

        if torch.cuda.is_available():
            return arch_name(_current_capability(torch)), False
    except Exception:  # a broken CUDA set-up still allows CPU use
        pass
    return DEFAULT_ARCH, True


def _current_capability(torch) -> tuple[int, int]:
    """The current GPU's compute capability.  Once PyTorch's CUDA is initialised, from
    it (its current device); before that, from the driver for device 0 (what PyTorch's
    current device will be): ``torch.cuda.get_device_capability`` would initialise
    PyTorch's CUDA, 0.2-0.3 s that a process which only compiles, or a JAX program
    that never uses PyTorch's CUDA, should not pay."""
    if not torch.cuda.is_initialized():
        found = _driver_capability(0)
        if found is not None:
            return found
    return torch.cuda.get_device_capability()


def _driver_capability(index: int) -> tuple[int, int] | None:
    try:
        from cuda.bindings import driver

        ok = driver.CUresult.CUDA_SUCCESS
        (err,) = driver.cuInit(0)
        if err != ok:
            return None
        err, device = driver.cuDeviceGet(index)
        if err != ok:
            return None
        attrs = driver.CUdevice_attribute
        found = []
        for attr in (attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                     attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR):
            err, value = driver.cuDeviceGetAttribute(attr, device)
            if err != ok:
                return None
            found.append(int(value))
        return found[0], found[1]
    except Exception:  # no cuda-bindings, or an old one: PyTorch answers
        return None
