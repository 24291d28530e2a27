"""The dtypes a kernel parameter may have, and every spelling that names them.

One table (``_DTYPES``) holds each supported dtype with its torch, NumPy and
Numba-CUDA counterparts; :func:`resolve_dtype` maps any accepted spelling
(``torch.float32``, ``float``, ``"float32"``, ``"f32"``, ``np.float32``,
``np.dtype("float32")``, ``"float"``, ``"uint8_t"``, ``"torch::kFloat32"``, a Numba
type) onto one :class:`DType`.

One dtype is a record: ``"xoroshiro128p"``, the state of one of Numba's
xoroshiro128+ generators (``numba.cuda.random.xoroshiro128p_dtype``, two uint64
words).  torch has no record dtypes, so its tensor is uint64 with a trailing axis of
two words (:attr:`DType.lanes`), which kernels see as a 1-D array of records: the
states :func:`pnex_magic.xoroshiro128p_states` makes, as Numba's
``create_xoroshiro128p_states`` makes them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

__all__ = ["DType", "XOROSHIRO128P", "resolve_dtype", "supported_dtype_names", "record_dtype_names", "round_bf16"]


@dataclasses.dataclass(frozen=True)
class DType:
    """One supported element type."""

    name: str  #: canonical name, e.g. ``"float32"``
    torch: torch.dtype
    numpy: np.dtype | None  #: ``None`` where NumPy has no such type (bfloat16)
    numba_name: str  #: attribute of ``numba.cuda.types``
    short: str  #: ``"f32"``-style spelling
    c_name: str  #: the C type, e.g. ``"float"``, ``"uint8_t"``
    #: torch elements per kernel element: 1, or for a record dtype the length of the
    #: tensor's trailing axis (2 uint64 words per xoroshiro128p state)
    lanes: int = 1

    @property
    def storage_itemsize(self) -> int:
        """Bytes of one element of the torch tensor."""
        return torch.empty((), dtype=self.torch).element_size()

    @property
    def itemsize(self) -> int:
        """Bytes of one element as the kernel sees it (a whole record)."""
        return self.storage_itemsize * self.lanes

    @property
    def is_record(self) -> bool:
        """Whether the kernel sees records (:attr:`lanes` torch elements each)."""
        return self.lanes > 1

    @property
    def is_floating_point(self) -> bool:
        return self.torch.is_floating_point

    @property
    def schema_scalar(self) -> str:
        """The torch schema type of a scalar argument of this dtype."""
        if self.torch is torch.bool:
            return "bool"
        return "float" if self.torch.is_floating_point else "int"

    @property
    def python_type(self) -> type:
        return {"bool": bool, "float": float, "int": int}[self.schema_scalar]

    def numba_type(self) -> Any:
        if self.is_record:
            from numba.cuda.np.numpy_support import from_dtype

            return from_dtype(self.numpy)
        from numba.cuda import types as nbtypes

        return getattr(nbtypes, self.numba_name)

    def __str__(self) -> str:
        return self.name


def _d(name: str, tdt: torch.dtype, npname: str | None, numba_name: str, short: str, c_name: str) -> DType:
    return DType(name, tdt, np.dtype(npname) if npname else None, numba_name, short, c_name)


_DTYPES: tuple[DType, ...] = (
    _d("float16", torch.float16, "float16", "float16", "f16", "__half"),
    _d("bfloat16", torch.bfloat16, None, "bfloat16", "bf16", "__nv_bfloat16"),
    _d("float32", torch.float32, "float32", "float32", "f32", "float"),
    _d("float64", torch.float64, "float64", "float64", "f64", "double"),
    _d("int8", torch.int8, "int8", "int8", "i8", "int8_t"),
    _d("int16", torch.int16, "int16", "int16", "i16", "int16_t"),
    _d("int32", torch.int32, "int32", "int32", "i32", "int32_t"),
    _d("int64", torch.int64, "int64", "int64", "i64", "int64_t"),
    _d("uint8", torch.uint8, "uint8", "uint8", "u8", "uint8_t"),
    _d("uint16", torch.uint16, "uint16", "uint16", "u16", "uint16_t"),
    _d("uint32", torch.uint32, "uint32", "uint32", "u32", "uint32_t"),
    _d("uint64", torch.uint64, "uint64", "uint64", "u64", "uint64_t"),
    _d("bool", torch.bool, "bool", "boolean", "b8", "bool"),
)

#: numba.cuda.random.xoroshiro128p_dtype, written out so that resolving it imports no Numba.
XOROSHIRO128P = np.dtype([("s0", np.uint64), ("s1", np.uint64)], align=True)

#: Record dtypes: a torch tensor of ``lanes`` elements per record on its last axis.
_RECORDS: tuple[DType, ...] = (
    DType("xoroshiro128p", torch.uint64, XOROSHIRO128P, "xoroshiro128p_type", "xoroshiro128p",
          "xoroshiro128p_state", lanes=2),
)


def _build_aliases() -> dict[Any, DType]:
    aliases: dict[Any, DType] = {}
    for dt in _DTYPES:
        keys: list[Any] = [dt.torch, dt.name, dt.short, dt.c_name, dt.numba_name]
        keys.append("torch::k" + dt.name[0].upper() + dt.name[1:])  # torch::kFloat32
        if dt.c_name.endswith("_t"):
            keys.append(dt.c_name[:-2])
        if dt.numpy is not None:
            keys += [dt.numpy, dt.numpy.type]
        aliases.update({k: dt for k in keys})
    by_name = {dt.name: dt for dt in _DTYPES}
    # Python's own types and the C spellings follow the older package: float is float32.
    for dt in _RECORDS:
        aliases.update({dt.name: dt, dt.numpy: dt, f"{dt.name}_dtype": dt})
    aliases.update(
        {
            float: by_name["float32"],
            int: by_name["int64"],
            bool: by_name["bool"],
            "float": by_name["float32"],
            "double": by_name["float64"],
            "half": by_name["float16"],
            "int": by_name["int64"],
            "long": by_name["int64"],
            "torch::kHalf": by_name["float16"],
            "torch::kBFloat16": by_name["bfloat16"],
            "torch::kFloat": by_name["float32"],
            "torch::kDouble": by_name["float64"],
            "torch::kInt": by_name["int32"],
            "torch::kLong": by_name["int64"],
            "torch::kByte": by_name["uint8"],
            "torch::kChar": by_name["int8"],
            "torch::kShort": by_name["int16"],
            "torch::kBool": by_name["bool"],
        }
    )
    return aliases


_ALIASES = _build_aliases()


def supported_dtype_names() -> tuple[str, ...]:
    """The element dtypes (every one a torch dtype of its own)."""
    return tuple(dt.name for dt in _DTYPES)


def record_dtype_names() -> tuple[str, ...]:
    """The record dtypes (a torch tensor of :attr:`DType.lanes` words per record)."""
    return tuple(dt.name for dt in _RECORDS)


def resolve_dtype(spelling: Any) -> DType | None:
    """Return the :class:`DType` that ``spelling`` names, or ``None`` if none does."""
    if isinstance(spelling, DType):
        return spelling
    try:
        found = _ALIASES.get(spelling)
    except TypeError:  # unhashable
        return None
    if found is not None:
        return found
    if isinstance(spelling, str):
        return _ALIASES.get(spelling.strip().lower().removeprefix("torch.").removeprefix("np."))
    # Numba types (numba.float32, numba.cuda.types.float32) have a ``name``.
    name = getattr(spelling, "name", None)
    if isinstance(name, str) and type(spelling).__module__.startswith("numba"):
        return _ALIASES.get(name)
    return None


def round_bf16(value: Any) -> np.float32:
    """``value`` rounded once to bfloat16 (8 significant bits, float32's exponent
    range, subnormals, ties to even), held in a float32."""
    f = float(value)
    if f != f or f in (math.inf, -math.inf) or f == 0.0:
        return np.float32(f)
    m, e = math.frexp(f)  # f = m * 2**e, 0.5 <= |m| < 1
    bits = min(8, e + 133)  # below 2**-126 the spacing stays 2**-133
    r = math.ldexp(round(math.ldexp(m, bits)), e - bits)  # round(): ties to even, exactly
    if abs(r) >= 2.0**128:
        return np.float32(math.copysign(math.inf, f))
    return np.float32(r)
