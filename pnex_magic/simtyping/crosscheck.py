"""Numba-CUDA's own typing of a kernel and its device functions, for the typed
rewrite to be checked against (:meth:`.kernel.Build.cross_check`).

The kernel is typed as the GPU compile types it: its frozen device functions made
into ``@cuda.jit(device=True)`` dispatchers (a library's: its own), the parameter
types the compile is given, Numba's untyped passes (SSA, dead-branch pruning,
literal propagation) and type inference, and nothing after: no lowering of the
kernel itself, no NVVM.  Typing its calls compiles the device functions for the
signatures it calls them with; their type maps are read from those compiles.
"""

from __future__ import annotations

import functools
import logging
import types
from typing import Any

from ..numbadriver import numba_error_line
from ..errors import KernelTypingError
from ..lazycuda import resolve as resolve_lazy_cuda
from ..snapshot import DeviceFunction, derive
from . import numba_types as T

__all__ = ["numba_variable_types"]

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _typing_pipeline() -> Any:
    """numba-cuda's compiler pipeline cut after type inference."""
    from numba.cuda.compiler import CUDACompiler
    from numba.cuda.core.compiler_machinery import PassManager
    from numba.cuda.core.typed_passes import NopythonTypeInference

    class TypingOnly(CUDACompiler):
        def define_pipelines(self):
            pm = PassManager("pnex_simulator_typing")
            for entry in CUDACompiler.define_pipelines(self)[0].passes:
                pm.passes.append(entry)
                if entry[0] is NopythonTypeInference:
                    break
            pm.finalize()
            return [pm]

    return TypingOnly


def _typemap(fn: types.FunctionType, argtypes: tuple) -> dict:
    from numba.cuda.compiler import CUDAFlags
    from numba.cuda.core import bytecode
    from numba.cuda.core.targetconfig import ConfigStack
    from numba.cuda.core.untyped_passes import ExtractByteCode
    from numba.cuda.descriptor import cuda_target

    flags = CUDAFlags()
    flags.no_compile = True
    flags.no_cpython_wrapper = True
    flags.no_cfunc_wrapper = True
    flags.error_model = "numpy"
    pipeline = _typing_pipeline()(cuda_target.typing_context, cuda_target.target_context, None, argtypes, None,
                                  flags, {})
    state = pipeline.state
    state.func_id = bytecode.FunctionIdentity.from_function(fn)
    ExtractByteCode().run_pass(state)
    state.lifted = ()
    state.lifted_from = None
    with ConfigStack().enter(state.flags.copy()):
        pm = pipeline.define_pipelines()[0]
        pm.run(state)
    return dict(state.typemap)


def _variables(typemap: dict) -> dict[str, set]:
    out: dict[str, set] = {}
    for key, ty in typemap.items():
        if key.startswith(("$", "arg.")):
            continue
        out.setdefault(key.split(".")[0], set()).add(ty)
    return out


def numba_variable_types(kernel: types.FunctionType, argtypes: tuple, functions: list[tuple[Any, tuple]],
                         name: str) -> list[dict[str, set]] | None:
    """For each of ``functions`` (``(None, signature)`` for the kernel itself,
    ``(device function, signature)`` for one it calls), the types Numba gives each
    of its variables, by name; ``None`` where this numba-cuda's compiler cannot be
    driven this way (said once in the log).

    Raises
    ------
    KernelTypingError
        Numba cannot type the kernel: the GPU compile fails the same way.
    """
    from numba import cuda

    dispatchers: dict[int, Any] = {}

    def convert(value: Any, in_closure: bool) -> Any:
        if isinstance(value, DeviceFunction):
            disp = value.original if value.library else cuda.jit(device=True, **value.options)(value.function)
            dispatchers[id(value.original)] = disp
            return disp
        return resolve_lazy_cuda(value)

    try:
        target = derive(kernel, convert)
        with T.typing_lock():
            kernel_map = _typemap(target, argtypes)
    except (ImportError, AttributeError) as exc:
        _unavailable(exc)
        return None
    except Exception as exc:  # Numba's typing errors come in many classes
        line = numba_error_line(exc, kernel.__code__.co_filename)
        at = f" (line {line})" if line else ""
        first = T._first_line(exc)
        raise KernelTypingError(f"kernel {name!r}{at}: Numba cannot type the kernel for its parameter types, so "
                                f"neither the GPU nor the CUDA simulator can run it: {first}",
                                compiler_log=str(exc), lineno=line) from None
    out = []
    for device, signature in functions:
        if device is None:
            out.append(_variables(kernel_map))
            continue
        disp = dispatchers.get(id(device.original))
        compiled = getattr(disp, "overloads", {}).get(tuple(signature)) if disp is not None else None
        annotation = getattr(compiled, "type_annotation", None)
        if annotation is None:
            with T.typing_lock():
                own = derive(device.function, convert)
                out.append(_variables(_typemap(own, tuple(signature))))
        else:
            out.append(_variables(annotation.typemap))
    return out


_SAID: list[str] = []


def _unavailable(exc: BaseException) -> None:
    """Say once that this numba-cuda's pipeline cannot be driven to check the rewrite."""
    if not _SAID:
        _SAID.append(str(exc))
        log.warning("pnex: this numba-cuda's compiler cannot be stopped after typing (%s: %s); the CUDA simulator's "
                    "types are not checked against Numba's", type(exc).__name__, exc)
