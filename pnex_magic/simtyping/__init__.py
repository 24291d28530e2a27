"""The CUDA simulator computes what the GPU computes: a kernel rewritten so that
NumPy, running it on CPU tensors, computes with Numba-CUDA's types.

numba-cuda's simulator runs a kernel's Python source on NumPy scalars, and NumPy's
rules are not Numba's: NumPy 2 keeps ``float32 * 0.1`` in float32 and
``int32 + 3000000000`` in int32 (an error), where Numba types ``0.1`` as float64 and
``3000000000`` as int64 and computes in those; ``math.sqrt`` of a float32 is a
Python float in NumPy, a float32 in Numba.  :func:`typed_kernel` rewrites the
kernel's source once per definition so that every intermediate has Numba's type:

==========================  ===========================================================
module                      what it holds
==========================  ===========================================================
:mod:`.numba_types`         Numba-CUDA's typing context, asked one operation at a time
:mod:`.runtime`             conversions and operations computed as the GPU computes them
:mod:`.values`              a value as the rewrite sees it; the code that converts one
:mod:`.promotion`           when NumPy computes an operation as Numba does, and the
                            fewest conversions that make it
:mod:`.expressions`         operators, comparisons, attributes, subscripts; the
                            branches Numba prunes at compile time
:mod:`.calls`               calls: math.*, cuda.*, builtins, conversions, device
                            functions
:mod:`.statements`          assignments, stores, and where paths join (Numba's phi
                            nodes): branches and loops
:mod:`.kernel`              one typed kernel and its device functions
:mod:`.crosscheck`          Numba's own typing of the same functions, which every
                            rewrite is checked against
:mod:`.stored`              a typed kernel as the disk cache keeps it, made again
                            without Numba
==========================  ===========================================================

What the rewrite promises and what it does not is in :mod:`pnex_magic.launch.simulator`.
"""

from __future__ import annotations

from .kernel import typed_kernel
from .stored import loads

__all__ = ["typed_kernel", "loads"]
