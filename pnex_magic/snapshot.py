"""One snapshot of a kernel, taken when it is defined: what every compile and the
simulator read.

Numba bakes the values of the globals and closure variables a kernel reads into its
code when it compiles.  pnex compiles some forms of a kernel later than its
definition (a strided-layout variant, a ``Tune`` choice, the checked variant, another
architecture) and runs it in the simulator on CPU tensors, so it keeps one copy of
what the kernel reads, taken at definition (:func:`freeze`), and builds every form
from it:

* the kernel and the ``@cuda.jit(device=True)`` (or ``numba.jit``) functions it calls,
  recursively, as copies with globals and closure cells of their own;
* NumPy arrays copied (their contents become constants), scalars and tuples as they
  are (immutable), the attributes a kernel reads of a user module (``config.BLOCK``)
  copied into a :class:`FrozenModule`;
* a device function as a :class:`DeviceFunction`: its frozen Python function and
  options, made into a Numba dispatcher (:func:`derive`, at compile time: a
  compile-cache hit imports no part of Numba's compiler) or a simulated one;
* a **device array** (a torch tensor, CUDA or CPU, or any object with
  ``__cuda_array_interface__``, such as a Numba device array) is not copied: it is
  a :class:`HiddenArray`, a trailing parameter of every compiled form that every
  launcher passes, as the same object, at every launch.  An in-place update is seen
  by the next launch (Numba's promise for device arrays) and no address is in the
  code, so the compile cache stays valid in a new process;
* foreign CUDA C++ functions (``cuda.declare_device``) it calls are named in
  :attr:`Snapshot.foreign`: the simulator cannot run them.

Redefining the kernel (re-running its cell) takes a new snapshot, as Numba's
re-decoration does.  :mod:`pnex_magic.fingerprint` hashes the snapshot, so the cache
key covers exactly what the code is built from.
"""

from __future__ import annotations

import dataclasses
import dis
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from .dtypes import DType, resolve_dtype
from .errors import KernelDefinitionError, KernelLaunchError
from .lazycuda import is_lazy_cuda
from .lazycuda import resolve as resolve_lazy_cuda

__all__ = [
    "Snapshot",
    "DeviceFunction",
    "FrozenModule",
    "HiddenArray",
    "freeze",
    "is_dispatcher",
    "derive",
    "compilable",
    "simulable",
    "referenced_names",
    "code_names",
    "global_names",
    "is_user_module",
    "is_device_array",
    "is_foreign_function",
    "device_options",
    "DEVICE_OPTIONS",
]

#: Top-level packages whose modules a kernel reads as libraries (``math.sqrt``,
#: ``np.float32``, ``cuda.grid``): never copied, never hashed attribute by attribute.
_LIBRARIES = frozenset({"numba", "numba_cuda", "math", "cmath", "numpy", "operator", "cffi", "torch"})


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def code_names(code: types.CodeType, free: bool = False) -> set[str]:
    """The global and attribute names ``code`` and the code nested in it mention (``free``:
    their free variables' names too)."""
    names: set[str] = set()
    for c in _code_objects(code):
        names.update(c.co_names)
        if free:
            names.update(c.co_freevars)
    return names


def referenced_names(fn: types.FunctionType) -> set[str]:
    """Global names (and attribute names) the function's code mentions."""
    return code_names(fn.__code__)


def global_names(fn: types.FunctionType) -> set[str]:
    """The names the function's code (nested code included) reads as globals: no
    attribute names, unlike :func:`referenced_names`."""
    names: set[str] = set()
    for code in _code_objects(fn.__code__):
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str):
                names.add(ins.argval)
    return names


def is_user_module(value: Any) -> bool:
    """Whether ``value`` is a module whose attributes a kernel reads as values
    (``config.BLOCK``), not a library (:data:`_LIBRARIES`)."""
    return isinstance(value, types.ModuleType) and value.__name__.split(".")[0] not in _LIBRARIES


def is_device_array(value: Any) -> bool:
    """A torch tensor (any device) or an object with ``__cuda_array_interface__``."""
    if isinstance(value, torch.Tensor):
        return True
    if is_lazy_cuda(value) or isinstance(value, (type, types.ModuleType)):
        return False
    return getattr(type(value), "__cuda_array_interface__", None) is not None


def is_dispatcher(value: Any) -> bool:
    # The type's module first: reading an attribute of pnex's lazy ``cuda`` imports Numba.
    return type(value).__module__.startswith("numba") and getattr(value, "py_func", None) is not None


def _is_library_function(fn: Any) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARIES


def is_foreign_function(value: Any) -> bool:
    """A CUDA C++ function declared with ``cuda.declare_device``."""
    return type(value).__name__ == "ExternFunction" and type(value).__module__.startswith("numba")


class FrozenModule(types.ModuleType):
    """The attributes a kernel reads of a user module, as they were at definition."""


class DeviceFunction:
    """A ``@cuda.jit(device=True)`` (or ``numba.jit``) function a kernel calls, frozen:
    its Python function's copy and the options of its dispatcher."""

    __slots__ = ("function", "options", "original")

    def __init__(self, function: types.FunctionType, options: dict[str, Any], original: Any):
        self.function = function
        self.options = options  #: the CUDA dispatcher's options ({} for numba.jit)
        self.original = original  #: the dispatcher it was frozen from

    @property
    def library(self) -> bool:
        """Whether it is a library's (``numba.cuda.random``'s, say), whose globals do not
        change: compiled through its own dispatcher, which keeps what it compiled."""
        return _is_library_function(self.original.py_func)

    def __repr__(self) -> str:
        return f"<pnex frozen device function {self.function.__qualname__}>"


#: Options of a CUDA device function that change its code, passed on to its new
#: dispatcher (and hashed by the fingerprint).
DEVICE_OPTIONS = ("fastmath", "debug", "lineinfo", "opt", "inline", "forceinline", "link", "lto")


def device_options(dispatcher: Any) -> dict[str, Any]:
    """The :data:`DEVICE_OPTIONS` of a CUDA dispatcher (a ``numba.jit`` one: none)."""
    if not type(dispatcher).__module__.startswith("numba.cuda"):
        return {}
    return {k: v for k, v in getattr(dispatcher, "targetoptions", {}).items() if k in DEVICE_OPTIONS}


class HiddenArray:
    """A device array a kernel reads as a global (or closure variable): a trailing
    parameter of every compiled form, passed the same object at every launch.  Its
    dtype, rank and layout are part of the code (and the cache key); its address and
    contents are not."""

    __slots__ = ("name", "dtype", "ndim", "contiguous", "obj", "_tensor")

    def __init__(self, name: str, dtype: DType, ndim: int, contiguous: bool, obj: Any):
        self.name = name
        self.dtype = dtype
        self.ndim = ndim
        self.contiguous = contiguous
        self.obj = obj
        self._tensor: torch.Tensor | None = obj if isinstance(obj, torch.Tensor) else None

    @property
    def layout(self) -> str:
        """Numba's layout of the parameter: ``"C"`` (contiguous at definition) or ``"A"``."""
        return "C" if self.contiguous else "A"

    def describe(self) -> str:
        return f"{self.dtype.name}, {self.ndim}-D, {'contiguous' if self.contiguous else 'strided'}"

    def tensor(self) -> torch.Tensor:
        """The array as a torch tensor: the global's own tensor, or a zero-copy view of
        a ``__cuda_array_interface__`` object (made once)."""
        if self._tensor is None:
            self._tensor = torch.as_tensor(self.obj, device="cuda")
        return self._tensor

    def __repr__(self) -> str:
        return f"<pnex hidden argument {self.name}: {self.describe()}>"

    @classmethod
    def of(cls, kernel: str, name: str, value: Any) -> HiddenArray:
        where = f"kernel {kernel!r} reads the global {name!r}"
        if isinstance(value, torch.Tensor):
            dtype, ndim, contiguous = resolve_dtype(value.dtype), value.dim(), value.is_contiguous()
            what = f"a {str(value.dtype).removeprefix('torch.')} tensor"
        else:
            cai = value.__cuda_array_interface__
            np_dtype = np.dtype(cai["typestr"])
            shape, strides = tuple(cai["shape"]), cai.get("strides")
            dtype, ndim = resolve_dtype(np_dtype), len(shape)
            expected = [int(np.prod(shape[i + 1:], dtype=np.int64)) * np_dtype.itemsize for i in range(ndim)]
            contiguous = strides is None or all(s == e or n == 1 for s, e, n in zip(strides, expected, shape))
            what = f"a {np_dtype} device array"
        if dtype is None:
            raise KernelDefinitionError(
                f"{where}, {what}, whose dtype pnex cannot pass to a kernel; use one of the dtypes of In(...) "
                f"(float16 to float64, int8 to uint64, bool)"
            )
        return cls(name, dtype, ndim, contiguous, value)


@dataclasses.dataclass(frozen=True, eq=False)
class Snapshot:
    """What :func:`freeze` took of a kernel."""

    #: The kernel's copy: its globals and closure as they were, device functions as
    #: :class:`DeviceFunction`, device arrays as :class:`HiddenArray`.
    function: types.FunctionType
    #: The device arrays it reads, by name: the trailing parameters of every compiled form.
    hidden: tuple[HiddenArray, ...] = ()
    #: The CUDA C++ functions (``cuda.declare_device``) it or its device functions call.
    foreign: tuple[str, ...] = ()

    @property
    def hidden_names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hidden)


def freeze(fn: types.FunctionType) -> Snapshot:
    """The snapshot of kernel ``fn`` (see the module docstring).  Needs no Numba.

    Raises
    ------
    KernelDefinitionError
        A device array is read where it cannot be passed as a hidden argument (by a
        device function, as a module attribute, inside a tuple), or has a dtype pnex
        does not pass.
    """
    freezer = _Freezer(fn.__name__)
    clone = freezer.function(fn, kernel=True)
    hidden = tuple(sorted(freezer.hidden.values(), key=lambda h: h.name))
    return Snapshot(clone, hidden, tuple(sorted(freezer.foreign)))


class _Freezer:
    def __init__(self, kernel: str):
        self.kernel = kernel
        self.functions: dict[int, types.FunctionType] = {}
        self.devices: dict[int, DeviceFunction] = {}
        self.modules: dict[int, FrozenModule] = {}
        self.hidden: dict[str, HiddenArray] = {}
        self.foreign: set[str] = set()

    def function(self, fn: types.FunctionType, kernel: bool = False) -> types.FunctionType:
        found = self.functions.get(id(fn))
        if found is not None:
            return found
        clone = _clone(fn)
        new_globals, cells = clone.__globals__, clone.__closure__ or ()
        self.functions[id(fn)] = clone
        names = referenced_names(fn)
        reads = global_names(fn)
        where = "the kernel" if kernel else f"its device function {fn.__qualname__!r}"
        for name in sorted(names):
            if name in new_globals:
                new_globals[name] = self.value(new_globals[name], name, names, where if name in reads else None, kernel)
        for var, old, new in zip(fn.__code__.co_freevars, fn.__closure__ or (), cells):
            try:
                value = old.cell_contents
            except ValueError:
                continue  # an empty cell stays empty
            new.cell_contents = self.value(value, var, names, where, kernel)
        return clone

    def value(self, value: Any, name: str, names: set[str], reader: str | None, kernel: bool) -> Any:
        """The frozen form of ``value``, read as ``name``; ``reader`` says who reads it as
        a variable (``None``: the name is only an attribute name of the code)."""
        if is_lazy_cuda(value):
            return value
        if is_device_array(value):
            if reader is None:
                return value  # an attribute name that happens to be a global: never read
            if not kernel:
                raise KernelDefinitionError(
                    f"kernel {self.kernel!r}: {reader} reads the device array {name!r} as a global; pnex passes device "
                    f"arrays read by the kernel itself as hidden arguments, but not through device functions. Pass "
                    f"{name!r} to the device function as a parameter (the kernel reads the global and passes it on)"
                )
            hidden = HiddenArray.of(self.kernel, name, value)
            self.hidden[name] = hidden
            return hidden
        if isinstance(value, np.ndarray):
            return value.copy()  # Numba bakes its contents into the code
        if isinstance(value, tuple):
            if any(is_device_array(v) for v in value) and reader is not None:
                raise KernelDefinitionError(
                    f"kernel {self.kernel!r}: the global {name!r} is a tuple holding a device array; pnex passes a "
                    f"device array read as a global by itself only. Bind each array to a global name of its own, or "
                    f"pass it as a parameter"
                )
            return tuple(self.value(v, name, names, None, kernel) for v in value)
        if is_dispatcher(value) and value.targetoptions.get("device", True):
            return self.device_function(value)
        if is_foreign_function(value):
            self.foreign.add(getattr(value, "name", name))
            return value
        if is_user_module(value):
            return self.module(value, names)
        return value

    def device_function(self, dispatcher: Any) -> DeviceFunction:
        found = self.devices.get(id(dispatcher))
        if found is not None:
            return found
        frozen = DeviceFunction(None, device_options(dispatcher), dispatcher)  # type: ignore[arg-type] # filled below
        self.devices[id(dispatcher)] = frozen
        frozen.function = self.function(dispatcher.py_func)
        return frozen

    def module(self, module: types.ModuleType, names: set[str]) -> FrozenModule:
        """The module frozen with the attributes ``names`` (those its reader reads); one
        frozen module per module, which gains the names of every reader (a kernel and a
        device function of another file may read different attributes of ``pnex.tc``)."""
        frozen = self.modules.get(id(module))
        if frozen is None:
            frozen = FrozenModule(module.__name__, getattr(module, "__doc__", None))
            self.modules[id(module)] = frozen  # before its attributes: a device function in it may read it again
        attributes = vars(module)
        lazy = attributes.get("__getattr__")  # PEP 562: pnex_magic's own submodules (pnex.tc, pnex.random) load on use
        for attr in sorted(names):
            if attr.startswith("__") or attr in vars(frozen):
                continue
            if attr not in attributes:
                if lazy is None:
                    continue
                try:
                    lazy(attr)
                except AttributeError:
                    continue
                attributes = vars(module)
                if attr not in attributes:
                    continue
            value = attributes[attr]
            if is_device_array(value):
                raise KernelDefinitionError(
                    f"kernel {self.kernel!r} reads {module.__name__}.{attr}, a device array, as a module attribute; "
                    f"pnex passes a device array read as a global name only. Bind it to a global name "
                    f"({attr} = {module.__name__}.{attr}) and read that, or pass it as a parameter"
                )
            setattr(frozen, attr, self.value(value, attr, names, None, False))
        return frozen


# --------------------------------------------------------------------------- derived forms


def derive(fn: types.FunctionType, convert: Callable[[Any, bool], Any]) -> types.FunctionType:
    """A copy of the frozen function ``fn`` whose globals and closure cells hold what
    ``convert(value, in_closure)`` makes of the snapshot's values (a Numba dispatcher for
    a :class:`DeviceFunction`, say); the snapshot itself is left as it is."""
    return _Deriver(convert).function(fn)


def _clone(fn: types.FunctionType) -> types.FunctionType:
    """``fn`` with the same code over a copy of its globals and empty cells of its own (the
    caller fills them), under its names: ``__name__``, ``__qualname__`` and ``__module__``
    as they are now, which may differ from what the ``def`` and its module gave (a kernel
    factory renames its kernels; ``benchmarks/workloads_lib`` names its kernels' module
    ``workloads``, as ``numpy``'s ``set_module`` does).  The cache key hashes the copy's
    ``module.qualname`` (:mod:`pnex_magic.fingerprint`) and the op's name the original's,
    so the two must agree; Numba names the compiled function after it too.  The globals
    stay those of the module the kernel was written in: what its code reads."""
    cells = tuple(types.CellType() for _ in fn.__closure__ or ())
    clone = types.FunctionType(fn.__code__, dict(fn.__globals__), fn.__name__, fn.__defaults__, cells or None)
    clone.__qualname__ = fn.__qualname__
    clone.__module__ = fn.__module__  # FunctionType takes the globals' __name__
    clone.__doc__ = fn.__doc__
    clone.__kwdefaults__ = fn.__kwdefaults__
    return clone


class _Deriver:
    def __init__(self, convert: Callable[[Any, bool], Any]):
        self.convert = convert
        self.memo: dict[int, Any] = {}

    def copy(self, fn: types.FunctionType) -> tuple[types.FunctionType, bool]:
        found = self.memo.get(id(fn))
        if found is not None:
            return found, False
        new = _clone(fn)
        self.memo[id(fn)] = new
        return new, True

    def fill(self, fn: types.FunctionType, new: types.FunctionType) -> None:
        glb = new.__globals__
        for name in referenced_names(fn):
            if name in glb:
                glb[name] = self.value(glb[name], False)
        for old, cell in zip(fn.__closure__ or (), new.__closure__ or ()):
            try:
                cell.cell_contents = self.value(old.cell_contents, True)
            except ValueError:
                pass  # an empty cell

    def function(self, fn: types.FunctionType) -> types.FunctionType:
        new, fresh = self.copy(fn)
        if fresh:
            self.fill(fn, new)
        return new

    def value(self, value: Any, in_closure: bool) -> Any:
        if isinstance(value, DeviceFunction):
            found = self.memo.get(id(value))
            if found is None:
                new, fresh = self.copy(value.function)
                found = self.memo[id(value)] = self.convert(DeviceFunction(new, value.options, value.original), in_closure)
                if fresh:
                    self.fill(value.function, new)
            return found
        if isinstance(value, tuple):
            return tuple(self.value(item, in_closure) for item in value)
        if isinstance(value, FrozenModule):
            found = self.memo.get(id(value))
            if found is None:
                found = self.memo[id(value)] = FrozenModule(value.__name__, value.__doc__)
                for attr, item in vars(value).items():
                    if not attr.startswith("__"):
                        setattr(found, attr, self.value(item, False))
            return found
        return self.convert(value, in_closure)


def compilable(fn: types.FunctionType) -> types.FunctionType:
    """``fn`` (a frozen kernel, possibly rewritten) as Numba compiles it: each
    :class:`DeviceFunction` a new ``@cuda.jit(device=True)`` dispatcher of its frozen
    function with its options (a library's: its own dispatcher), pnex's lazy ``cuda``
    the module.  Imports Numba."""
    from numba import cuda

    def convert(value: Any, in_closure: bool) -> Any:
        if isinstance(value, DeviceFunction):
            if value.library:
                return value.original
            return cuda.jit(device=True, **value.options)(value.function)
        return resolve_lazy_cuda(value)

    return derive(fn, convert)


def simulable(fn: types.FunctionType, kernel: str, foreign: tuple[str, ...] = ()) -> types.FunctionType:
    """``fn`` (a frozen kernel, possibly rewritten) as the CUDA simulator runs it: each
    :class:`DeviceFunction` simulated, ``numba.cuda`` the real module in globals (the
    simulator swaps it for its fake by identity) and, in closure cells (``from numba
    import cuda`` inside the function that defines the kernel, which the simulator does
    not swap), a stand-in that reads the fake module of the kernel being run.

    Raises
    ------
    KernelLaunchError
        The kernel calls CUDA C++ (``foreign``), which the simulator cannot run.
    """
    if foreign:
        names = ", ".join(repr(name) for name in foreign)
        raise KernelLaunchError(
            f"kernel {kernel!r} calls CUDA C++ ({names}, declared with cuda.declare_device), which the CUDA simulator "
            f"cannot run, so it runs on a GPU only: pass CUDA tensors"
        )
    from numba import cuda
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    def convert(value: Any, in_closure: bool) -> Any:
        if isinstance(value, DeviceFunction):
            return FakeCUDAKernel(value.function, device=True)
        value = resolve_lazy_cuda(value)
        if in_closure and value is cuda:
            return _SIMULATED_CUDA
        return value

    return derive(fn, convert)


class _SimulatedCuda:
    """``numba.cuda`` in a closure cell while the simulator runs: the fake module of
    the kernel being run (the real one outside a run)."""

    def __getattr__(self, name: str) -> Any:
        from numba.cuda.simulator import kernel

        context = kernel._get_kernel_context()
        if context is None:
            from numba import cuda

            return getattr(cuda, name)
        return getattr(context, name)


_SIMULATED_CUDA = _SimulatedCuda()
