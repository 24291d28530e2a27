"""The Python GPU launcher: load the kernel's cubin into the device's primary
context (the one PyTorch uses) and launch it on PyTorch's current stream, through
``cuda.bindings``' driver API.

It serves CUDA calls while the C++ launcher (:mod:`pnex_magic.launch.native`) builds
in the background (:mod:`pnex_magic.launch.switch`), where it cannot be built (no C++
compiler or CUDA headers) and with ``PNEX_LAUNCHER=driver``; it costs tens of
microseconds of Python per call, where the C++ launcher costs none.  A launch packs
its arguments with one ``struct`` call into a buffer kept per thread (:func:`packed`).

Kernel arguments follow Numba's ABI: an array is passed as (meminfo, parent,
nitems, itemsize, data, shape..., strides...) with strides in bytes; raw
pointers are passed, so bfloat16 and float16 tensors work.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..calls import launch_grid
from ..errors import KernelLaunchError
from ..spec import KernelSpec, ScalarParam, SeedParam, TensorParam, TuneParam
from . import autotune, checks, cooperative, shared
from .faults import BLOCKING_ADVICE, is_fault, launch_blocking
from .hidden import hidden_tensors
from .kernel import Kernel


__all__ = ["DriverLauncher", "launch_blocking", "scalar_bits", "scalar_slot", "packed"]

_SCALAR_CTYPES = {
    "float16": ctypes.c_uint16,  # passed as raw bits
    "bfloat16": ctypes.c_uint16,
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "int8": ctypes.c_int8,
    "int16": ctypes.c_int16,
    "int32": ctypes.c_int32,
    "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8,
    "uint16": ctypes.c_uint16,
    "uint32": ctypes.c_uint32,
    "uint64": ctypes.c_uint64,
    "bool": ctypes.c_uint8,
}


def scalar_bits(dtype_name: str, value: Any) -> int | float | bool:
    """The value a scalar parameter is passed as (2-byte floats as raw bits)."""
    if dtype_name in ("float16", "bfloat16"):
        t = torch.tensor(float(value), dtype=getattr(torch, dtype_name))
        return int(t.view(torch.int16).item()) & 0xFFFF
    if dtype_name == "bool":
        return int(bool(value))
    return value


def scalar_slot(dtype_name: str, value: Any) -> int:
    """The 8-byte argument slot of a scalar parameter as the C++ launchers fill it (the
    value in the parameter's C type, zero-padded), read as a signed 64-bit integer."""
    raw = bytes(_SCALAR_CTYPES[dtype_name](scalar_bits(dtype_name, value)))
    return int.from_bytes(raw.ljust(8, b"\0"), "little", signed=True)


# The 8-byte argument slot of each C type a launch passes: the value in that type, then
# zeros (struct's format, little-endian, no padding of its own).
_SLOTS = {
    ctypes.c_void_p: "Q", ctypes.c_int64: "q", ctypes.c_uint64: "Q", ctypes.c_double: "d", ctypes.c_float: "f4x",
    ctypes.c_int32: "i4x", ctypes.c_uint32: "I4x", ctypes.c_int16: "h6x", ctypes.c_uint16: "H6x", ctypes.c_int8: "b7x",
    ctypes.c_uint8: "B7x",
}


class _ArgumentBlock:
    """A launch's kernel parameters, for one list of argument types: packed by one
    ``struct`` call into a buffer kept per thread, with the array of pointers to its
    slots that ``cuLaunchKernel`` reads them through (the driver copies them at the
    launch), so a launch allocates nothing; cuda.bindings' own packing of a tuple of
    values and ctypes types converts each value and allocates a block per call."""

    def __init__(self, types: tuple[Any, ...]) -> None:
        self.format = struct.Struct("<" + "".join(_SLOTS[t] for t in types))
        self.count = max(len(types), 1)
        self.local = threading.local()

    def address(self, args: Sequence[Any]) -> int:
        """Pack ``args`` into this thread's buffer; the address of its pointer array."""
        found = getattr(self.local, "buffers", None)
        if found is None:
            block = ctypes.create_string_buffer(8 * self.count)
            pointers = (ctypes.c_void_p * self.count)(*(ctypes.addressof(block) + 8 * i for i in range(self.count)))
            found = self.local.buffers = (block, pointers, ctypes.addressof(pointers))
        self.format.pack_into(found[0], 0, *args)
        return found[2]


_blocks: dict[tuple[Any, ...], _ArgumentBlock] = {}


def packed(args: Sequence[Any], types: Sequence[Any]) -> Any:
    """``cuLaunchKernel``'s kernelParams for ``args`` of the ctypes ``types``: the address
    of a packed block (:class:`_ArgumentBlock`), or, for a type it has no slot for, the
    tuple of values and types cuda.bindings packs."""
    key = tuple(types)
    block = _blocks.get(key)
    if block is None:
        if not all(t in _SLOTS for t in key):
            return (tuple(args), key)
        block = _blocks.setdefault(key, _ArgumentBlock(key))
    return block.address(args)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device: torch.device) -> int:
    """PyTorch's current stream on ``device`` (its handle), without making a Stream object."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _raw_stream(index) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream


def _check(result, what: str, kernel: str) -> Any:
    from cuda.bindings import driver

    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        raise KernelLaunchError(
            f"kernel {kernel!r}: {what} failed with {name.decode() if name else err}: "
            f"{text.decode() if text else ''}"
        )
    return result[1] if len(result) == 2 else result[1:]


def _ensure_context(device: torch.device, kernel: str) -> None:
    """Bind the device's primary context (PyTorch's) to this thread if none is current,
    as on autograd's backward worker thread before it made any CUDA runtime call."""
    from cuda.bindings import driver

    ctx = _check(driver.cuCtxGetCurrent(), "querying the current context", kernel)
    if int(ctx) != 0:
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    dev = _check(driver.cuDeviceGet(index), "finding the device", kernel)
    ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "retaining the primary context", kernel)
    _check(driver.cuCtxSetCurrent(ctx), "making the context current", kernel)


def _pack_array(t: torch.Tensor, lanes: int, args: list[Any], types: list[Any]) -> None:
    """Numba's ABI for an array: (meminfo, parent, nitems, itemsize, data, shape...,
    strides... in bytes).  ``lanes > 1``: a record dtype, whose tensor's last axis holds
    the words of each record (itemsize ``lanes`` words, that axis not an axis)."""
    item = t.element_size()
    axes = t.dim() - (1 if lanes > 1 else 0)
    args += [0, 0, t.numel() // lanes, item * lanes, t.data_ptr()]
    args += list(t.shape[:axes])
    args += [stride * item for stride in t.stride()[:axes]]
    types += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    types += [ctypes.c_int64] * (2 * axes)


def _contiguous(spec: KernelSpec, values: Sequence[Any]) -> bool:
    """Whether every input tensor is contiguous (the "C" variant's condition)."""
    return all(v.is_contiguous() for p, v in zip(spec.params, values) if isinstance(p, TensorParam) and p.is_input)


class DriverLauncher:
    """Pure-Python GPU launcher over the CUDA driver API (``cuda.bindings``)."""

    name = "driver"

    def register(self, definition: Kernel) -> bool:
        """Nothing to register: calls reach :meth:`launch` through the op's Python
        implementation."""
        return False

    def unregister(self, op_name: str) -> None:
        pass

    def autograd_registered(self, definition: Kernel) -> None:
        pass

    def __init__(self) -> None:
        # Loaded functions per definition (weakly held: a redefined kernel's entry goes
        # with it), keyed by (device index, layout, Tune variant, checked).
        self._functions: weakref.WeakKeyDictionary[Any, dict[tuple[int, str, int, bool], Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._modules: list[Any] = []
        self._lock = threading.Lock()
        self._last: dict[int, str] = {}  # device index -> the kernel launched last there
        # (function, threads, dynamic shared bytes) -> (blocks per SM, SMs)
        self._occupancy: dict[tuple[int, int, int], tuple[int, int]] = {}

    def last_kernel(self, device: int) -> str:
        """The kernel this launcher launched last on cuda:``device`` ("" if none)."""
        return self._last.get(device, "")

    def _function(self, definition: Kernel, device: torch.device, layout: str, variant: int = 0,
                  checked: bool = False):
        from cuda.bindings import driver

        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, layout, variant, checked)
        fn = self._functions.get(definition, {}).get(key)
        if fn is not None:
            return fn
        with self._lock:
            arch = "sm_%d%d" % torch.cuda.get_device_capability(index)
            image, entry = definition.kernel_image(arch, layout, variant, checked=checked)
            with torch.cuda.device(index):
                _ensure_context(torch.device("cuda", index), definition.spec.name)
                module = _check(driver.cuModuleLoadData(image), "loading the module", definition.spec.name)
                fn = _check(
                    driver.cuModuleGetFunction(module, entry.encode()),
                    "finding the kernel",
                    definition.spec.name,
                )
                self._modules.append(module)
                # Dynamic shared memory: refused above the device's limit, opted in above 48 KiB.
                shared.prepare(fn, definition.spec.name, definition.spec.shared_of(variant), index)
            self._functions.setdefault(definition, {})[key] = fn
            return fn

    def candidate(self, definition: Kernel, values: Sequence[Any], device: torch.device) -> int:
        """The launch candidate of a call (block and ``Tune`` variant): the autotuner's
        choice for its key."""
        spec = definition.spec
        if not spec.autotuned:
            return 0
        env = {p.name: v for p, v in zip(spec.params, values)}
        choice, _ = autotune.choose(
            definition,
            device_index=device.index if device.index is not None else torch.cuda.current_device(),
            layout="C" if _contiguous(spec, values) else "A",
            key=autotune.key_values(spec, env),
            capturing=torch.cuda.is_current_stream_capturing(),
            runner=lambda: self._runner(definition, values, device),
        )
        return choice

    def _runner(self, definition: Kernel, values: Sequence[Any], device: torch.device) -> autotune.Runner:
        """Candidates launched on copies of the ``InMut`` arguments and outputs of their own."""
        spec = definition.spec
        bench = [
            v.clone() if p.role == "inmut" else torch.empty_like(v) if p.role == "out" else v
            for p, v in zip(spec.params, values)
        ]
        env = {p.name: v for p, v in zip(spec.params, bench)}
        written = [i for i, p in enumerate(spec.params) if p.role in ("inmut", "out")]

        def run(index: int) -> list[torch.Tensor]:
            shape, variant = spec.launch_candidates[index]
            env.update(spec.tune_values(variant))
            call = [env[p.name] if isinstance(p, TuneParam) else v for p, v in zip(spec.params, bench)]
            grid, block = launch_grid(spec, env, shape)
            if grid[0] and grid[1] and grid[2]:
                self.launch(definition, call, grid, block, device, variant)
            return [bench[i] for i in written]

        def reset() -> None:
            for i in written:
                p = spec.params[i]
                if p.role == "inmut":
                    bench[i].copy_(values[i])
                elif p.init is not None:
                    bench[i].fill_(p.init)

        def n_threads(variant: int) -> tuple[int, ...]:
            return tuple(int(e.evaluate({**env, **spec.tune_values(variant)})) for e in spec.n_threads)

        return autotune.Runner(run, reset, n_threads, device)

    def _check_coresident(self, definition: Kernel, fn: Any, index: int, grid: tuple[int, int, int],
                          block: tuple[int, int, int], dynamic_shared: int = 0) -> None:
        """Refuse a cooperative launch whose blocks cannot all be resident (:mod:`.cooperative`);
        ``dynamic_shared``: the launch's bytes of dynamic shared memory per block."""
        from cuda.bindings import driver

        name = definition.spec.name
        threads = block[0] * block[1] * block[2]
        key = (int(fn), threads, dynamic_shared)
        found = self._occupancy.get(key)
        if found is None:
            dev = _check(driver.cuDeviceGet(index), "finding the device", name)
            attribute = driver.CUdevice_attribute
            supported = _check(driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev),
                               "querying the device", name)
            if not supported:
                raise KernelLaunchError(
                    f"kernel '{name}' synchronises its grid (cuda.cg.this_grid().sync()), which needs a cooperative "
                    f"launch, and this GPU does not support cooperative launches"
                )
            per_sm = _check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, dynamic_shared),
                            "querying the occupancy", name)
            sms = _check(driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                         "querying the device", name)
            found = self._occupancy[key] = (int(per_sm), int(sms))
        problem = cooperative.problem(name, grid, block, *found)
        if problem is not None:
            raise KernelLaunchError(problem)

    def launch(
        self,
        definition: Kernel,
        values: Sequence[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        device: torch.device,
        variant: int = 0,
    ) -> None:
        from cuda.bindings import driver

        checked = checks.wanted(definition)
        if checked and torch.cuda.is_current_stream_capturing():
            raise checks.capture_error(definition.spec.name)
        layout = "C" if _contiguous(definition.spec, values) else "A"
        fn = self._function(definition, device, layout, variant, checked)
        args: list[Any] = []
        types: list[Any] = []

        for param, value in zip(definition.spec.params, values):
            if isinstance(param, TuneParam):
                continue  # a constant in the variant's code: no argument slot
            if isinstance(param, TensorParam):
                _pack_array(value, param.dtype.lanes, args, types)
            elif isinstance(param, SeedParam):  # the seed drawn for this call (op.py), a 1-D array
                _pack_array(value, 1, args, types)
            elif isinstance(param, ScalarParam):
                args.append(scalar_bits(param.dtype.name, value))
                types.append(_SCALAR_CTYPES[param.dtype.name])
            else:
                args.append(0)
                types.append(ctypes.c_void_p)
        record = None
        if checked:  # the error record, a 1-D int64 array, after the kernel's parameters
            record = torch.zeros(checks.RECORD_SLOTS, dtype=torch.int64, device=device)
            _pack_array(record, 1, args, types)
        for _, tensor in hidden_tensors(definition, device):  # device arrays read as globals, last
            _pack_array(tensor, 1, args, types)
        stream = _current_stream(device)
        with torch.cuda.device(device):
            _ensure_context(device, definition.spec.name)
            index = device.index if device.index is not None else torch.cuda.current_device()
            previous = self._last.get(index, "")
            self._last[index] = definition.spec.name
            dynamic_shared = definition.spec.shared_of(variant)  # cuda.shared.array(0, dtype)'s bytes
            try:
                params = packed(args, types)
                if getattr(definition, "cooperative", False):  # a grid sync: every block resident at once
                    self._check_coresident(definition, fn, index, grid, block, dynamic_shared)
                    result = driver.cuLaunchCooperativeKernel(fn, *grid, *block, dynamic_shared, stream, params)
                else:
                    result = driver.cuLaunchKernel(fn, *grid, *block, dynamic_shared, stream, params, 0)
                _check(result, "launch", definition.spec.name)
            except KernelLaunchError as exc:
                if not is_fault(exc) or launch_blocking():
                    raise
                earlier = f" (the last pnex kernel launched there was {previous!r})" if previous else ""
                raise KernelLaunchError(
                    f"{exc}; this error is left by an earlier kernel on this device{earlier}. {BLOCKING_ADVICE}"
                ) from None
            if launch_blocking():
                _check(driver.cuStreamSynchronize(stream), "running (synchronised after launch)", definition.spec.name)
        if record is not None:
            error = definition.violation_error(record.cpu().tolist())  # .cpu() waits for the kernel
            if error is not None:
                raise error

