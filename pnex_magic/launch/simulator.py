"""CPU back end: numba-cuda's CUDA simulator runs the kernel's Python source, each
CUDA thread as Python code (a block's threads one after another until one waits, then
each on a Python thread of its own: :mod:`.block_simulator`), on NumPy views of the CPU
tensors (no copies: writes land in the tensors).  It runs the same source as the GPU, including
shared memory (dynamic shared memory too: ``cuda.shared.array(0, dtype)`` gets the
variant's ``shared_bytes``), ``cuda.syncthreads()`` and atomics, which makes it the way to
prototype and test without a GPU.  A kernel that synchronises its grid
(``cuda.cg.this_grid().sync()``) runs with every block at once
(:mod:`.grid_simulator`); any other, block after block as numba runs it, with a
barrier that its threads tell instead of one that a loop polls
(:mod:`.block_simulator`), the blocks of a thread-block cluster at once.  A kernel
whose threads wait where they can never all meet (a hang on the GPU) is a
``KernelLaunchError`` that says where each group of threads waits (:mod:`.waits`).  It is
slow: keep problem sizes small.  An autotuned op
runs its first candidate here (first block, first ``Tune`` choices).

The source it runs is the kernel's, rewritten once per definition so that it
computes with Numba-CUDA's types (:mod:`pnex_magic.simtyping`): literals, scalars as
declared, promotions, integer wrap-around, ``//`` and ``%``, ``math.*``, float16
and bfloat16 as on the GPU, each operation rounded as there (bit for bit for
IEEE-exact operations; ``math.*`` within libdevice's error bounds plus an ulp).
Not simulated: timing; the order of atomics and of unsynchronised shared-memory
accesses (threads run one block at a time, in no promised order); a warp's lock-step
execution (shuffles, votes and the tensor-core primitives meet at a rendezvous of the warp's
lanes: :mod:`pnex_magic.tc.simulate`); the GPU's fusing of ``a * b + c`` into one ``fma`` (the simulator rounds
twice, as with ``-fma=0``)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import collector
from ..dtypes import round_bf16
from ..errors import KernelLaunchError, PnexError
from ..spec import ScalarParam, SeedParam, TensorParam, TuneParam
from . import autotune, block_simulator, checks, grid_simulator
from .hidden import hidden_tensors
from .kernel import Kernel
from .waits import Deadlock


__all__ = ["SimulatorLauncher"]

# The simulator keeps one global "current kernel"; launches must not overlap.
_LOCK = threading.Lock()


class SimulatorLauncher:
    name = "simulator"

    def register(self, definition: Kernel) -> bool:
        return False

    def unregister(self, op_name: str) -> None:
        pass

    def autograd_registered(self, definition: Kernel) -> None:
        pass

    def candidate(self, definition: Kernel, values: Sequence[Any], device: torch.device) -> int:
        """The first candidate (the first block and the first choice of every ``Tune``
        parameter): the simulator's speed says nothing about the GPU's, so it does not
        autotune.  Where ``tune_requires`` has rules per call: the first candidate the call's
        sizes keep."""
        spec = definition.spec
        if not spec.variant_checks:
            return 0
        return spec.first_candidate(autotune.key_values(spec, {p.name: v for p, v in zip(spec.params, values)}))

    def launch(
        self,
        definition: Kernel,
        values: Sequence[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        device: torch.device,
        variant: int = 0,
    ) -> None:
        checked = checks.wanted(definition)
        simulated = definition.simulated_function(checked=checked, variant=variant)
        if simulated is None:
            raise KernelLaunchError(
                f"kernel {definition.spec.name!r} has no Python source here (it was loaded from a saved "
                f"artifact), so it cannot run on CPU tensors through the CUDA simulator; pass CUDA tensors"
            )
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        from ..tc.simulate import Bf16Shadow, install_warp_functions

        install_warp_functions()  # shuffles, votes and syncwarp, which numba's simulator lacks

        args: list[Any] = []
        write_back: list[tuple[torch.Tensor, torch.Tensor]] = []

        def array(value: torch.Tensor, written: bool) -> Any:
            tensor = value.detach()
            shadow_of_bf16 = tensor.dtype == torch.bfloat16
            if shadow_of_bf16:
                # NumPy has no bfloat16: simulate on a float32 copy, round on the way back.
                shadow = tensor.float()
                if written:
                    write_back.append((tensor, shadow))
                tensor = shadow
            data = tensor.numpy()
            if shadow_of_bf16:
                data = data.view(Bf16Shadow)  # pnex.tc's byte-level primitives see 2-byte elements
            return FakeCUDAArray(data)

        for param, value in zip(definition.spec.params, values):
            if isinstance(param, TensorParam):
                if param.dtype.is_record:  # (..., lanes) words: a view of records, writes land in the tensor
                    args.append(FakeCUDAArray(value.detach().numpy().view(param.dtype.numpy)[..., 0]))
                else:
                    args.append(array(value, param.role != "in"))
            elif isinstance(param, SeedParam):  # the int64 seed drawn for this call, read as uint64
                args.append(FakeCUDAArray(value.numpy().view(np.uint64)))
            elif isinstance(param, ScalarParam):  # a NumPy scalar of the declared type, as the GPU's argument
                if param.dtype.numpy is None:  # bfloat16: its value, held in a float32
                    args.append(round_bf16(value))
                else:
                    args.append(param.dtype.numpy.type(value))
            elif isinstance(param, TuneParam):
                args.append(value)  # a Python constant, as the compiled variant sees it
            else:
                args.append(None)
        record = np.zeros(checks.RECORD_SLOTS, dtype=np.int64)
        if checked:
            args.append(FakeCUDAArray(record))
        # Device arrays the kernel reads as globals (CPU tensors here), after the record:
        # a NumPy view of each, so the kernel reads (and may write) the tensor itself.
        args += [array(tensor, True) for _, tensor in hidden_tensors(definition, device)]
        whole_grid = grid[0] * grid[1] * grid[2] > 1 and _grid_sync(simulated)
        shared = definition.spec.shared_of(variant)  # dynamic shared memory: cuda.shared.array(0, dtype)
        # (older objects frozen: the launch's thread objects trigger full collections, which would walk torch's)
        with _LOCK, collector.older_objects_frozen(), warnings.catch_warnings():
            # CUDA's integers wrap around (Numba's xoroshiro128p_* rely on it) and its floats overflow to
            # inf, divide by zero to inf and give NaN without a word: NumPy's warnings about it say
            # nothing about the kernel.
            warnings.filterwarnings(
                "ignore", r"(overflow|invalid value|divide by zero|underflow) encountered", RuntimeWarning)
            try:
                cluster = definition.spec.cluster_dims
                if whole_grid and cluster is not None:
                    raise KernelLaunchError(
                        f"kernel {definition.spec.name!r} synchronises its grid and has thread-block clusters "
                        f"(cluster_dims={cluster}): the CUDA simulator does not run the two together; run it on a GPU"
                    )
                if whole_grid:  # a grid sync: every block at once (numba's simulator runs them one by one)
                    grid_simulator.run(definition.spec.name, simulated, grid, block, args, shared)
                else:  # numba's, with a barrier that is told; a cluster's blocks at once
                    block_simulator.run(simulated, grid, block, args, shared, cluster)
            except PnexError:
                raise
            except Deadlock as exc:  # (names the lines itself: the traceback is the block manager's)
                raise KernelLaunchError(f"kernel {definition.spec.name!r} cannot finish in the CUDA simulator: {exc}") \
                    from None
            except Exception as exc:
                raise KernelLaunchError(
                    f"kernel {definition.spec.name!r} failed in the CUDA simulator{_where(exc, simulated)}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        if checked:
            error = definition.violation_error(record)
            if error is not None:
                raise error
        for tensor, shadow in write_back:
            tensor.copy_(shadow)


def _grid_sync(simulated: Any) -> bool:
    """Whether the simulated kernel synchronises its grid (:func:`grid_simulator.uses_grid_sync`,
    a walk of its code and its device functions' code), kept on the function: its globals
    are frozen at definition, so the answer does not change between launches."""
    found = getattr(simulated, "pnex_grid_sync", None)
    if found is None:
        found = simulated.pnex_grid_sync = grid_simulator.uses_grid_sync(simulated)
    return found


def _where(exc: BaseException, simulated: Any) -> str:
    """``" at line N: `text`"`` for the kernel's line an exception was raised at."""
    import linecache

    code = getattr(simulated, "__code__", None)
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None:
        return ""
    text = linecache.getline(code.co_filename, line).strip()
    return f" at line {line}" + (f": `{text}`" if text else "")
