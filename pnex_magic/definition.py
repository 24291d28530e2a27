"""A kernel definition: the user's function, its spec and options, and its compiled
forms per architecture.  :mod:`pnex_magic.define` builds one for every front end;
the op, the launchers and the report read from it.

What the stages after this one need of a definition is small, and a kernel loaded
from a saved artifact provides the same: ``spec``, ``op_name``, ``options``,
``kernel_image(arch, layout)`` (the code a GPU launcher loads) and, for CPU
tensors, ``simulated_function()``."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import threading
import types
from typing import Any

from ._version import __version__
from .arch import arch_name, default_arch, parse_arch
from .compiler import CompiledKernel, compile_kernel
from .cubin import cubin_arch
from .errors import KernelCompileError, KernelDefinitionError
from .fingerprint import function_fingerprint, referenced_names
from .spec import KernelSpec

__all__ = ["JitOptions", "KernelDefinition", "toolchain_versions"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JitOptions:
    """The options of ``jit()`` (and of the ``%%pnex`` magic)."""

    to_extension: bool = False
    cache_id: str | None = None
    verbose: bool = False
    max_registers: int | None = None
    arch: str | None = None  # None: the current GPU's, else $PNEX_ARCH, else sm_75
    use_cache: bool = True  # False: neither read nor write the disk cache
    force: bool = False  # recompile even on a cache hit (the new build is still stored)
    check: bool = False  # every GPU launch runs the checked variant (pnex_magic.checked)

    @classmethod
    def checked(
        cls,
        *,
        to_extension: bool = False,
        cache_id: str | None = None,
        verbose: bool = False,
        max_registers: int | None = None,
        arch: str | None = None,
        force: bool = False,
        check: bool | None = None,
    ) -> JitOptions:
        """Options from a front end's values, validated (``KernelDefinitionError``
        naming the option) and normalised (``arch`` as ``sm_XY``).  ``check=None``
        follows ``$PNEX_CHECK`` (``1``: checked launches)."""
        if max_registers is not None and (
            isinstance(max_registers, bool) or not isinstance(max_registers, int) or max_registers <= 0
        ):
            raise KernelDefinitionError(f"max_registers must be a positive int, got {max_registers!r}")
        if cache_id is not None and not isinstance(cache_id, str):
            raise KernelDefinitionError(f"cache_id must be a string, got {cache_id!r}")
        if arch is not None:
            arch = arch_name(parse_arch(arch))
        if check is None:
            check = os.environ.get("PNEX_CHECK", "0") == "1"
        return cls(
            to_extension=bool(to_extension),
            cache_id=cache_id,
            verbose=bool(verbose),
            max_registers=max_registers,
            arch=arch,
            force=bool(force),
            check=bool(check),
        )


@functools.lru_cache(maxsize=1)
def toolchain_versions() -> str:
    """Versions that change compiled code: part of every cache key."""
    from importlib import metadata

    import torch

    parts = [f"pnex_magic={__version__}", f"torch={torch.__version__}"]
    for dist in ("numba-cuda", "numba", "llvmlite"):
        try:
            parts.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist}=none")
    try:
        from numba.cuda.cudadrv import nvvm

        parts.append(f"nvvm={nvvm.NVVM().get_version()}")
    except Exception:
        parts.append("nvvm=unavailable")
    return ";".join(parts)


class KernelDefinition:
    """One kernel: function, spec, options; compiles lazily per architecture."""

    def __init__(self, fn: types.FunctionType, spec: KernelSpec, options: JitOptions):
        self.fn = fn
        self.spec = spec
        self.options = options
        self.source_key = function_fingerprint(fn, spec.describe())
        self._compiled: dict[str, CompiledKernel] = {}
        self._lock = threading.Lock()
        self._simulated: Any = None
        self._checked: Any = None  # pnex_magic.checked.CheckedKernel, made on first use
        self._simulated_checked: Any = None
        self.toolchain_error: str | None = None
        # Freeze what the simulator sees now, as Numba freezes globals when it compiles.
        self.simulated_function()

    @property
    def op_name(self) -> str:
        """Deterministic operator name: the kernel's name plus a short hash of where
        it was defined, so a re-run definition replaces its op."""
        site = hashlib.sha256(f"{self.spec.module}.{self.spec.qualname}".encode()).hexdigest()[:8]
        return f"{self.spec.name}_{site}"

    def target_arch(self, arch: str | None = None) -> str:
        return arch_name(parse_arch(arch or self.options.arch or default_arch()))

    def cache_key(self, arch: str, layout: str = "C", variant: int = 0, checked: bool = False) -> str:
        parts = [self.source_key, arch, layout, f"max_registers={self.options.max_registers}", toolchain_versions(),
                 "lineinfo"]
        if self.spec.tune_params:
            parts.append(f"tune={self.spec.tune_values(variant)!r}")
        if checked:
            parts.append("checked")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def checked_kernel(self) -> Any:
        """The kernel's checked variant (:func:`pnex_magic.checked.checked_kernel`): every
        array access tested against its array's shape, the first violation recorded.
        Raises ``KernelDefinitionError`` when the kernel's source cannot be read."""
        if self._checked is None:
            from .checked import checked_kernel

            self._checked = checked_kernel(self.fn)
        return self._checked

    def violation_error(self, record: Any) -> Exception | None:
        """The ``KernelIndexError`` a checked launch whose record (:mod:`pnex_magic.checked`)
        holds a violation raises; ``None`` when it holds none."""
        from .checked import violation_error

        return violation_error(self.spec.name, [int(v) for v in record], self.checked_kernel().sites)

    def compiled(
        self, arch: str | None = None, *, layout: str = "C", variant: int = 0, force: bool = False,
        checked: bool = False,
    ) -> CompiledKernel:
        """The kernel compiled for ``arch`` (memoised, and cached on disk).  ``layout``
        ``"C"`` is the variant for C-contiguous inputs (what launches use whenever every
        input is contiguous, and what reports show); ``"A"`` accepts any strides.
        ``variant`` picks the values of the ``Tune`` parameters
        (:attr:`~pnex_magic.spec.KernelSpec.tune_variants`; 0: the first choices).
        ``checked``: the checked variant (:meth:`checked_kernel`), which takes the error
        record as one more, last, argument."""
        arch = self.target_arch(arch)
        with self._lock:
            found = self._compiled.get((arch, layout, variant, checked))
            if found is not None and not force:
                return found
            fn, spec, cache_id = self.fn, self.spec, self.options.cache_id
            if checked:
                from .checked import checked_spec

                fn, spec = self.checked_kernel().function, checked_spec(self.spec)
                cache_id = None if cache_id is None else f"{cache_id}-checked"
            result = compile_kernel(
                fn,
                spec,
                arch=arch,
                key=self.cache_key(arch, layout, variant, checked),
                max_registers=self.options.max_registers,
                cache_id=cache_id,
                use_cache=self.options.use_cache,
                refresh=force or self.options.force,
                layout=layout,
                variant=variant,
            )
            self._compiled[(arch, layout, variant, checked)] = result
            return result

    def kernel_image(self, arch: str, layout: str = "C", variant: int = 0, checked: bool = False) -> tuple[bytes, str]:
        """What a GPU launcher loads for ``arch``: the cubin and the entry name.  Never
        PTX: loading it would depend on the driver's JIT compiler, which rejects PTX
        from a newer NVVM (see :mod:`pnex_magic.cubin`)."""
        compiled = self.compiled(arch, layout=layout, variant=variant, checked=checked)
        if compiled.cubin is None:
            raise KernelCompileError(
                f"kernel {self.spec.name!r}: no cubin for {compiled.arch} "
                f"({compiled.link_log.strip().splitlines()[0] if compiled.link_log.strip() else 'no nvJitLink'}); "
                f"pnex loads cubins only, never PTX for the driver to compile. Install nvJitLink: "
                f'pip install "pnex_magic[cu12]" (CUDA 12 drivers) or "pnex_magic[cu13]" (driver 580 or newer)'
            )
        built_for = cubin_arch(compiled.cubin)
        if built_for != compiled.arch:
            raise KernelCompileError(
                f"kernel {self.spec.name!r}: the cubin linked for {compiled.arch} says {built_for} in its ELF header"
            )
        return compiled.cubin, compiled.entry

    @property
    def compiles(self) -> bool:
        """Whether a CUDA compiler was found when the kernel was defined (else it runs
        on CPU tensors only, through the simulator)."""
        return self.toolchain_error is None

    def compiled_if_available(self) -> CompiledKernel | None:
        return next(iter(self._compiled.values()), None)

    def check_compiles(self) -> CompiledKernel | None:
        """Compile for the target architecture at definition time, so typing errors
        surface there.  A missing CUDA compiler (no NVVM wheel) is not an error: the
        op still runs on CPU tensors through the simulator (and it is said once)."""
        if self.options.check:
            self.checked_kernel()  # a kernel without source cannot be checked: say so now
        if self.toolchain_error is not None:
            return None
        try:
            return self.compiled()
        except KernelCompileError:
            raise
        except (OSError, ImportError, RuntimeError) as exc:
            text = str(exc)
            if "NVVM" in text or "nvvm" in text or "CUDA" in text:
                self.toolchain_error = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
                log.warning(
                    "pnex: kernel %r was not compiled (%s); it runs on CPU tensors through the CUDA "
                    "simulator only. Install numba-cuda[cu12] or numba-cuda[cu13] for PTX.",
                    self.spec.name,
                    self.toolchain_error,
                )
                return None
            raise

    def simulated_function(self, checked: bool = False) -> types.FunctionType:
        """The kernel as the CUDA simulator runs it: a copy whose globals and closure
        have every ``@cuda.jit(device=True)`` function replaced by its simulated form
        (``checked``: of the checked variant, which takes the error record last)."""
        if checked:
            if self._simulated_checked is None:
                self._simulated_checked = _simulable(self.checked_kernel().function, {})
            return self._simulated_checked
        if self._simulated is None:
            self._simulated = _simulable(self.fn, {})
        return self._simulated


def _simulable(fn: types.FunctionType, memo: dict[int, Any]) -> types.FunctionType:
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    if id(fn) in memo:
        return memo[id(fn)]

    def convert(value: Any) -> Any:
        py_func = getattr(value, "py_func", None)
        if py_func is not None and type(value).__module__.startswith("numba"):
            if id(value) not in memo:
                memo[id(value)] = FakeCUDAKernel(_simulable(py_func, memo), device=True)
            return memo[id(value)]
        return value

    new_globals = dict(fn.__globals__)
    for name in referenced_names(fn):
        if name in new_globals:
            new_globals[name] = convert(new_globals[name])
    closure = None
    if fn.__closure__:
        closure = tuple(types.CellType(convert(_cell_value(c))) for c in fn.__closure__)
    clone = types.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, closure)
    clone.__qualname__ = fn.__qualname__
    memo[id(fn)] = clone
    return clone


def _cell_value(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return None
