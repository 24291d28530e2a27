"""Tensor maps: the 128-byte descriptors through which Hopper's Tensor Memory Accelerator
copies a box of a 2-D tensor into shared memory (:func:`pnex_magic.tc.tma_load`).

On a CUDA tensor, :func:`tensor_map` asks the driver (``cuTensorMapEncodeTiled``) for
the descriptor and puts it in device memory, where a kernel takes it as a
``pnex.In("uint8", (128,))`` parameter.  Descriptors are kept (a small table keyed by
the tensor's address, shape, strides, dtype, box and swizzle, holding the tensor only
weakly), so a call with the same tensor costs a dictionary lookup, not a driver call
and a copy.  On a CPU tensor the 128 bytes name an entry of this module's table
instead, which the simulator reads (:mod:`.simulate_bulk`): the map reads the tensor
it was made for, as on the GPU.

A kernel that reads a map made for another tensor reads that tensor, on the GPU as in
the simulator: make the maps next to the call that passes their tensors.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Any

__all__ = ["tensor_map", "source_of", "SWIZZLES", "maps_among", "remake_maps"]

#: Swizzle modes (bytes) -> the driver's CUtensorMapSwizzle.
SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}
_MAGIC = b"PNEXTMAP"
_KEEP = 64  # descriptors kept per process
_LOCK = threading.Lock()
_TABLE: "OrderedDict[tuple, tuple[Any, Any]]" = OrderedDict()  # key -> (weakref to the tensor, descriptor)
_CPU: dict[int, tuple[Any, int, int, int]] = {}  # id -> (weakref to the tensor, box rows, box columns, swizzle)
_IDS = itertools.count(1)
_MADE: dict[int, tuple[Any, Any, int, int, int]] = {}  # id(desc) -> (desc, its tensor: weak references; box; swizzle)
_DRIVER: list[Any] = []


def _data_type(tensor: Any) -> int:
    import torch

    codes = {torch.uint8: 0, torch.uint16: 1, torch.int32: 3, torch.int64: 5, torch.float16: 6, torch.float32: 7,
             torch.float64: 8, torch.bfloat16: 9}
    if tensor.dtype not in codes:
        raise TypeError(f"pnex.tc.tensor_map: no tensor map for {tensor.dtype} tensors "
                        f"(float16, bfloat16, float32, float64 and integer tensors have one)")
    return codes[tensor.dtype]


def _check(tensor: Any, box: Any, swizzle: int) -> tuple[int, int]:
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
        raise ValueError(f"pnex.tc.tensor_map: the tensor must be a 2-D torch.Tensor, got "
                         f"{getattr(tensor, 'shape', type(tensor).__name__)}")
    _data_type(tensor)
    if not (isinstance(box, (tuple, list)) and len(box) == 2 and all(isinstance(b, int) for b in box)):
        raise ValueError(f"pnex.tc.tensor_map: box must be (rows, columns), two ints, got {box!r}")
    rows, cols = box
    size = tensor.element_size()
    if not (1 <= rows <= 256 and 1 <= cols <= 256):
        raise ValueError(f"pnex.tc.tensor_map: a box is 1 to 256 elements on each axis, got {box}")
    if swizzle not in SWIZZLES:
        raise ValueError(f"pnex.tc.tensor_map: swizzle must be one of {sorted(SWIZZLES)} (bytes), got {swizzle!r}")
    if swizzle and cols * size > swizzle:
        raise ValueError(f"pnex.tc.tensor_map: a box row of {cols} x {size} bytes is wider than the {swizzle}-byte "
                         f"swizzle; use a box of at most {swizzle // size} columns")
    if (cols * size) % 16:
        raise ValueError(f"pnex.tc.tensor_map: a box row must be a multiple of 16 bytes, got {cols} x {size}")
    if tensor.stride(1) != 1:
        raise ValueError(f"pnex.tc.tensor_map: the tensor's columns must be contiguous (stride 1), got strides "
                         f"{tuple(tensor.stride())}")
    if (tensor.stride(0) * size) % 16 or tensor.data_ptr() % 16:
        raise ValueError(f"pnex.tc.tensor_map: the tensor's address and row stride must be multiples of 16 bytes "
                         f"(address {tensor.data_ptr():#x}, row stride {tensor.stride(0) * size} bytes)")
    return rows, cols


def _driver() -> Any:
    if not _DRIVER:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"pnex.tc.tensor_map: the CUDA driver library is not available ({exc})") from None
        fn = getattr(lib, "cuTensorMapEncodeTiled", None)
        if fn is None:
            raise RuntimeError("pnex.tc.tensor_map: this CUDA driver has no cuTensorMapEncodeTiled (CUDA 12 or newer "
                               "is needed)")
        u32, u64 = ctypes.c_uint32, ctypes.c_uint64
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, ctypes.POINTER(u64), ctypes.POINTER(u64),
                       ctypes.POINTER(u32), ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _DRIVER.append(fn)
    return _DRIVER[0]


def _encode(tensor: Any, rows: int, cols: int, swizzle: int) -> bytes:
    """The driver's 128-byte CUtensorMap for ``tensor`` and the box (dimensions innermost first)."""
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    storage = (ctypes.c_uint8 * 192)()
    start = (-ctypes.addressof(storage)) % 64  # a CUtensorMap is 64-byte aligned
    where = ctypes.addressof(storage) + start
    dims = (u64 * 2)(tensor.shape[1], tensor.shape[0])
    strides = (u64 * 1)(tensor.stride(0) * tensor.element_size())
    box = (u32 * 2)(cols, rows)
    steps = (u32 * 2)(1, 1)
    l2_promotion = 2  # CU_TENSOR_MAP_L2_PROMOTION_L2_128B
    result = _driver()(where, _data_type(tensor), 2, ctypes.c_void_p(tensor.data_ptr()), dims, strides, box, steps,
                       0, SWIZZLES[swizzle], l2_promotion, 0)
    if result != 0:
        raise RuntimeError(f"pnex.tc.tensor_map: cuTensorMapEncodeTiled refused the map (CUresult {result}) for a "
                           f"{tuple(tensor.shape)} {tensor.dtype} tensor, box ({rows}, {cols}), swizzle {swizzle}")
    return bytes(storage[start:start + 128])


def tensor_map(tensor: Any, box: tuple[int, int], swizzle: int = 128) -> Any:
    """The tensor map of the 2-D ``tensor`` for copies of ``box = (rows, columns)``
    elements into shared memory, stored with the ``swizzle``-byte swizzle (128: the
    layout :func:`~pnex_magic.tc.wgmma` reads and :func:`~pnex_magic.tc.swizzle` gives;
    a box row is then at most 128 bytes, 64 float16).  A uint8 tensor of 128 bytes on
    ``tensor``'s device, for a ``pnex.In("uint8", (128,))`` parameter.  Out of the
    tensor, a copy reads zeros."""
    import torch

    rows, cols = _check(tensor, box, swizzle)
    key = (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, rows, cols,
           swizzle)
    with _LOCK:
        found = _TABLE.get(key)
        if found is not None and found[0]() is tensor:
            _TABLE.move_to_end(key)
            return found[1]
    if tensor.device.type == "cuda":
        data = _encode(tensor, rows, cols, swizzle)
    else:
        ident = next(_IDS)
        with _LOCK:
            for gone in [k for k, v in _CPU.items() if v[0]() is None]:
                del _CPU[gone]
            _CPU[ident] = (weakref.ref(tensor), rows, cols, swizzle)
        data = _MAGIC + ident.to_bytes(8, "little") + bytes(112)
    desc = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(tensor.device)
    with _LOCK:
        ident = id(desc)
        _MADE[ident] = (weakref.ref(desc, lambda _, ident=ident: _MADE.pop(ident, None)), weakref.ref(tensor), rows,
                        cols, swizzle)
        _TABLE[key] = (weakref.ref(tensor), desc)
        while len(_TABLE) > _KEEP:
            _TABLE.popitem(last=False)
    return desc


def source_of(data: bytes, who: str) -> tuple[Any, int, int, int]:
    """(the tensor, box rows, box columns, swizzle) of a tensor map made for a CPU tensor."""
    if data[:8] != _MAGIC:
        raise ValueError(f"{who}: these 128 bytes are not a tensor map made by pnex.tc.tensor_map() for a CPU tensor "
                         f"(a GPU tensor's map cannot be read on CPU: make the map for the tensor the call passes)")
    ident = int.from_bytes(data[8:16], "little")
    with _LOCK:
        found = _CPU.get(ident)
    tensor = found[0]() if found else None
    if tensor is None:
        raise RuntimeError(f"{who}: the tensor this map was made for no longer exists; make the map again for the "
                           f"tensor the call passes")
    return (tensor,) + found[1:]


def maps_among(args: Any) -> dict[int, tuple[int, int, int, int]]:
    """``{i: (j, rows, columns, swizzle)}`` for each argument ``i`` that is a tensor map made
    for argument ``j`` of the same call: what a child process (``--profile``,
    ``--sanitize``), whose copies of the tensors live at other addresses, must make
    again.  Raises ``ValueError`` for a map whose tensor the call does not pass."""
    found: dict[int, tuple[int, int, int, int]] = {}
    for i, arg in enumerate(args):
        with _LOCK:
            made = _MADE.get(id(arg))
        if made is None or made[0]() is not arg:
            continue
        source = made[1]()
        j = next((k for k, other in enumerate(args) if other is source), None)
        if j is None:
            raise ValueError(
                f"argument {i} is a tensor map (pnex.tc.tensor_map) of a tensor this call does not pass: the "
                f"kernel runs again in a child process, with copies of the call's tensors, where only the maps "
                f"of those can be made again; pass the tensor too"
            )
        found[i] = (j,) + made[2:]
    return found


def remake_maps(args: list[Any], maps: dict[Any, Any]) -> list[Any]:
    """``args`` with each tensor map of :func:`maps_among` made again for its tensor here."""
    out = list(args)
    for i, (j, rows, cols, swizzle) in maps.items():
        out[int(i)] = tensor_map(out[int(j)], (int(rows), int(cols)), int(swizzle))
    return out
