"""``cuda`` for ``%%pnex`` cells: ``numba.cuda``, imported on first use.

A cell sees ``cuda`` without importing it.  Importing ``numba.cuda`` takes most of a
second, and a cell whose kernel is in the compile cache needs none of it: the
kernel's code, resources and spec come from the disk.  So the cell gets
:data:`cuda`, a stand-in that imports ``numba.cuda`` when one of its attributes is
first read (``cuda.jit`` for a device function, ``cuda.to_device`` in the cell's own
code, ``cuda.grid`` when the kernel runs) and then forwards to it.

The stand-in serves every consumer of a kernel's globals:

* Numba types it as the module itself (``_numba_type_``), so a kernel compiled
  with it gets the same code as with ``from numba import cuda``;
* :mod:`pnex_magic.fingerprint` hashes it as the module, so both spellings share a
  cache entry;
* the CUDA simulator swaps ``numba.cuda`` for its fake module by identity, so
  :mod:`pnex_magic.definition` hands it the real module (:func:`resolve`).

Names starting with ``_`` are not forwarded: tools that probe objects
(``_repr_html_``, ``__wrapped__``, ...) must not import Numba.
"""

from __future__ import annotations

import types
from typing import Any

from . import warmup

__all__ = ["LazyCudaModule", "cuda", "is_lazy_cuda", "resolve"]

MODULE_NAME = "numba.cuda"


class LazyCudaModule:
    """Stands for ``numba.cuda`` until one of its attributes is read."""

    __slots__ = ()

    @staticmethod
    def module() -> types.ModuleType:
        """The real ``numba.cuda`` (imported now if it was not)."""
        # Never beside the background warm-up: while it imports numba.cuda, the module is
        # in sys.modules already, half initialised.  Once it is done this returns at once.
        warmup.wait()
        from numba import cuda as module

        return module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.module(), name)

    @property
    def _numba_type_(self) -> Any:
        # Numba asks a global of an unknown type for its type: the module's own.
        from numba.cuda import types as nbtypes

        return nbtypes.Module(self.module())

    def __dir__(self) -> list[str]:
        return dir(self.module())

    def __repr__(self) -> str:
        return "<module 'numba.cuda', imported on first use (pnex)>"

    def __reduce__(self) -> str:
        return "cuda"  # pickles as this module's singleton


cuda = LazyCudaModule()


def is_lazy_cuda(value: Any) -> bool:
    return type(value) is LazyCudaModule


def resolve(value: Any) -> Any:
    """``value``, with the stand-in replaced by the real ``numba.cuda``."""
    return LazyCudaModule.module() if type(value) is LazyCudaModule else value
