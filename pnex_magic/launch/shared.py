"""Dynamic shared memory at launch: a kernel's ``shared_bytes`` on a real GPU.

A kernel declares dynamic shared memory with ``cuda.shared.array(0, dtype)`` and its
definition says how many bytes each ``Tune`` variant launches with
(:attr:`~pnex_magic.spec.KernelSpec.shared_per_variant`).  Every launcher passes them
as ``cuLaunchKernel``'s ``sharedMemBytes``.  Above 48 KiB per block (static plus
dynamic) CUDA needs an opt-in per function: ``cuFuncSetAttribute(fn,
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes)``, made once when the function
is loaded (:func:`prepare`).  A request above what the device allows a block
(``CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN``, less the kernel's static
shared memory) is refused then, in the user's terms (:func:`limit_message`), never as
CUDA's ``CUDA_ERROR_INVALID_VALUE``.  The C++ launchers do the same with the same
message (``csrc/shared_memory.h``).
"""

from __future__ import annotations

from typing import Any

from ..errors import KernelLaunchError

__all__ = ["DEFAULT_LIMIT", "limit_message", "prepare"]

#: Shared memory (static plus dynamic) a block may use without the function's opt-in.
DEFAULT_LIMIT = 48 * 1024


def limit_message(kernel: str, asked: int, static: int, most: int, where: str) -> str:
    """Why ``asked`` bytes of dynamic shared memory cannot be given to a block of
    ``kernel`` on ``where`` (``"cuda:0"``), which allows a block ``most`` bytes of which
    the kernel's static shared memory takes ``static``.  csrc/shared_memory.h says the same."""
    left = max(most - static, 0)
    return (
        f"kernel '{kernel}': shared_bytes asks for {asked} B of dynamic shared memory per block, but {where} allows "
        f"a block at most {most} B of shared memory (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), and "
        f"the kernel's static shared memory takes {static} B of it, which leaves {left} B for shared_bytes. Ask "
        f"for at most {left} B (fewer pipeline stages or smaller tiles), or run it on a GPU with more shared memory"
    )


def prepare(fn: Any, kernel: str, asked: int, device_index: int) -> None:
    """Make the loaded function ``fn`` (cuda.bindings' ``CUfunction``) launchable with
    ``asked`` bytes of dynamic shared memory on cuda:``device_index``: refuse a request
    above the device's limit (``KernelLaunchError``), and opt in above 48 KiB."""
    if asked <= 0:
        return
    from cuda.bindings import driver

    def value(result: Any, what: str) -> int:
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            raise KernelLaunchError(f"kernel {kernel!r}: {what} failed with {result[0]!r}")
        return int(result[1])

    static = value(driver.cuFuncGetAttribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                   "reading its static shared memory")
    dev = value(driver.cuDeviceGet(device_index), "finding the device")
    most = value(driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
        "querying the device's shared memory per block")
    if static + asked > most:
        raise KernelLaunchError(limit_message(kernel, asked, static, most, f"cuda:{device_index}"))
    if static + asked > DEFAULT_LIMIT:
        (err,) = driver.cuFuncSetAttribute(
            fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, asked)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise KernelLaunchError(
                f"kernel {kernel!r}: opting in to {asked} B of dynamic shared memory per block "
                f"(cuFuncSetAttribute) failed with {err!r}"
            )
