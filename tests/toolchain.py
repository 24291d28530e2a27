"""What the machine's CUDA toolchain offers the CPU tests (shared by the test modules)."""

import pytest


def nvvm_available() -> bool:
    """Whether NVVM loads here (the numba-cuda cu12/cu13 wheels): PTX can be made."""
    try:
        from numba.cuda.cudadrv import nvvm

        nvvm.NVVM()
        return True
    except Exception:
        return False


needs_nvvm = pytest.mark.skipif(not nvvm_available(), reason="no NVVM (pip install numba-cuda[cu13])")
