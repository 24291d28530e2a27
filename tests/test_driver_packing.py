"""The Python driver launcher's argument block (``pnex_magic.launch.driver.packed``),
without a GPU: what ``cuLaunchKernel`` reads through the pointer array is, slot by
slot, what the C++ launchers pass (``scalar_slot``: the value in its C type, then
zeros), for every scalar dtype and Numba's array fields; each thread packs into a
buffer of its own; a type with no slot falls back to cuda.bindings' tuple form."""

from __future__ import annotations

import ctypes
import random
import threading

import pytest
import torch

from pnex_magic.launch import driver

DTYPES = sorted(driver._SCALAR_CTYPES)


def _slots(address: int, count: int) -> list[int]:
    """The 8-byte slots the pointer array at ``address`` points at, as signed integers."""
    pointers = (ctypes.c_void_p * count).from_address(address)
    return [ctypes.c_int64.from_address(pointers[i]).value for i in range(count)]


def _value(dtype: str, rng: random.Random):
    if dtype == "bool":
        return rng.random() < 0.5
    if dtype.startswith(("float", "bfloat")):
        return rng.uniform(-1e3, 1e3)
    info = torch.iinfo(getattr(torch, dtype))
    return rng.randint(info.min, info.max)


@pytest.mark.parametrize("seed", range(3))
def test_every_scalar_slot_holds_what_the_cpp_launchers_pass(seed):
    rng = random.Random(seed)
    values = [_value(d, rng) for d in DTYPES]
    args = [driver.scalar_bits(d, v) for d, v in zip(DTYPES, values)]
    types = [driver._SCALAR_CTYPES[d] for d in DTYPES]
    address = driver.packed(args, types)
    assert isinstance(address, int)
    assert _slots(address, len(DTYPES)) == [driver.scalar_slot(d, v) for d, v in zip(DTYPES, values)]


def test_array_fields_and_a_fresh_value_each_call():
    """Numba's array ABI (meminfo, parent, nitems, itemsize, data, shape, strides): the
    same block is repacked per call, so a second call's values replace the first's."""
    types = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
             ctypes.c_int64, ctypes.c_float]
    first = [0, 0, 1024, 4, 0x7F00_0000_1000, 1024, 4, 2.5]
    address = driver.packed(first, types)
    assert _slots(address, 7) == first[:7]
    pointers = (ctypes.c_void_p * 8).from_address(address)
    assert ctypes.c_float.from_address(pointers[7]).value == 2.5
    second = [0, 0, 7, 8, 0x7F00_0000_2000, 7, 8, -1.0]
    assert driver.packed(second, types) == address  # this thread's buffer, packed again
    assert _slots(address, 7) == second[:7] and ctypes.c_float.from_address(pointers[7]).value == -1.0


def test_each_thread_packs_into_a_buffer_of_its_own():
    types = [ctypes.c_int64] * 3
    found: dict[int, tuple[int, list[int]]] = {}
    barrier = threading.Barrier(4)

    def pack(k: int) -> None:
        address = driver.packed([k, k + 1, k + 2], types)
        barrier.wait()  # every thread has packed before any reads back
        found[k] = (address, _slots(address, 3))

    threads = [threading.Thread(target=pack, args=(10 * k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({address for address, _ in found.values()}) == 4
    assert all(slots == [k, k + 1, k + 2] for k, (_, slots) in found.items())


def test_a_type_without_a_slot_goes_to_cuda_bindings_as_a_tuple():
    args, types = [1, 2.0], [ctypes.c_int64, ctypes.c_longdouble]
    assert driver.packed(args, types) == ((1, 2.0), (ctypes.c_int64, ctypes.c_longdouble))
