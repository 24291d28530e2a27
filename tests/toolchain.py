"""What the machine's CUDA toolchain offers the CPU tests (shared by the test modules)."""

import numpy as np
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


def simulable(fn):
    """``fn`` (a kernel function, plain or checked) as pnex's simulator runs it: its
    snapshot (:func:`pnex_magic.snapshot.freeze`), device functions simulated."""
    from pnex_magic.snapshot import freeze
    from pnex_magic.snapshot import simulable as simulated_form

    return simulated_form(freeze(fn).function, fn.__name__)


def simulate(fn, grid, block, *args):
    """Run ``fn``, a checked kernel function (:mod:`pnex_magic.checking`), in numba-cuda's
    CUDA simulator on ``args`` (NumPy arrays are passed as device arrays); returns its
    error record."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    from pnex_magic.checking import RECORD_SIZE

    err = np.zeros(RECORD_SIZE, np.int64)
    wrapped = [FakeCUDAArray(a) if isinstance(a, np.ndarray) else a for a in args]
    FakeCUDAKernel(simulable(fn), device=False)[grid, block](*wrapped, FakeCUDAArray(err))
    return err
