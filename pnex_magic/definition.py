"""A kernel definition: the user's function, its spec and options, and its compiled
forms per architecture.  :mod:`pnex_magic.define` builds one for every front end;
the op, the launchers and the report read from it.

What the stages after this one need of a definition is small, and a kernel loaded
from a saved artifact provides the same: ``spec``, ``op_name``, ``options``,
``kernel_image(arch, layout, variant, checked)`` (the code a GPU launcher loads) and, for CPU
tensors, ``simulated_function()``.

A definition takes one snapshot of what the kernel reads (:mod:`pnex_magic.snapshot`)
when it is made; every form of the kernel (each layout, ``Tune`` and checked variant,
on every architecture, compiled now or later, and the simulator's) is built from it,
and the cache key is its fingerprint.  A device array the kernel reads as a global is
one of its ``hidden_arrays``: a trailing parameter every launcher passes."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import clusters
from ._version import __version__, installed_versions
from .codeversion import code_version
from .arch import arch_name, default_arch, default_is_stand_in, parse_arch
from .cubin import cubin_arch
from .errors import KernelCompileError, KernelDefinitionError
from .fingerprint import closure_token, function_fingerprint
from .hardware import max_shared_per_block
from .snapshot import HiddenArray, compilable, freeze, simulable
from .spec import KernelSpec

if TYPE_CHECKING:  # the compile stage is imported when a kernel is compiled (pnex.load never compiles)
    from .compiler import CompiledKernel

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
    # False: nothing of this kernel is read from or written to the disk cache (its builds, its
    # simulated form, its autotune choices, its SASS listing, the code version's digests)
    use_cache: bool = True
    force: bool = False  # recompile even on a cache hit (the new build is still stored)
    check: bool = False  # every GPU launch runs the checked variant (pnex_magic.checking)

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
        use_cache: bool = True,
    ) -> JitOptions:
        """Options from a front end's values, validated (``KernelDefinitionError``
        naming the option) and normalised (``arch`` as ``sm_XY``).  ``check=None``
        follows ``$PNEX_CHECK`` (``1``: checked launches)."""
        if not isinstance(use_cache, bool):
            raise KernelDefinitionError(f"cache must be True or False, got {use_cache!r}")
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
            use_cache=use_cache,
        )


# Distributions whose versions change compiled code: Numba's typing and lowering, the
# NVVM that emits PTX (the cu13 and cu12 wheels), nvJitLink that links the cubin and
# NVRTC that compiles the float16/bfloat16 helpers linked in, and their bindings.
# The CUDA runtime wheels ship libcudadevrt.a, linked into kernels that synchronise their grid.
_TOOLCHAIN_DISTS = (
    "numba-cuda", "numba", "llvmlite",
    "nvidia-nvvm", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc",
    "nvidia-nvjitlink", "nvidia-nvjitlink-cu12", "nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12",
    "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12",
    "cuda-bindings",
)
_NVVM_WHEELS = ("nvidia-nvvm", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc")


def toolchain_versions(*, use_cache: bool = True) -> str:
    """Versions that change compiled code: part of every cache key.

    pnex_magic's own is its version and its code's (:func:`pnex_magic.codeversion.code_version`:
    a development install's code changes under one version number; ``use_cache=False``:
    computed without the digests the cache folder keeps).  The others are
    read from the installed distributions' metadata, without importing Numba or
    loading NVVM, so that a cache hit runs no part of the compiler.  Where no NVVM
    wheel is installed, numba-cuda finds a CUDA toolkit through $CUDA_HOME,
    $CUDA_PATH or $CONDA_PREFIX: those folders (and the toolkit's version.json)
    join the key instead."""
    return f"pnex_magic={__version__}+{code_version(use_cache=use_cache)};{_other_versions()}"


@functools.lru_cache(maxsize=1)
def _other_versions() -> str:
    import torch

    found = installed_versions(*_TOOLCHAIN_DISTS)
    parts = [f"torch={torch.__version__}"]
    parts += [f"{dist}={version or 'none'}" for dist, version in found.items()]
    if not any(found[dist] for dist in _NVVM_WHEELS):
        for var in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX"):
            folder = os.environ.get(var)
            if folder:
                parts.append(f"{var}={folder}:{_read_small(os.path.join(folder, 'version.json'))}")
    return ";".join(parts)


def _read_small(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(1 << 20)).hexdigest()[:16]
    except OSError:
        return "-"


def _checking() -> Any:
    """:mod:`pnex_magic.checking`, imported when a kernel's checked variant is first needed."""
    from . import checking  # lazy: the checked variant's rewrite and Numba overloads stay off the cache-hit path

    return checking


class KernelDefinition:
    """One kernel: function, spec, options; compiles lazily per architecture."""

    def __init__(
        self, fn: types.FunctionType, spec: KernelSpec, options: JitOptions, *,
        simulate: Callable[[KernelDefinition, bool, int], types.FunctionType],
    ):
        """``simulate(definition, checked, variant)`` makes the kernel as the CUDA
        simulator runs it (:meth:`simulated_function`): the simulator's stage, which
        :func:`pnex_magic.define.definition` hands every definition, so that this stage
        never imports the simulator's typed rewrite (issue 37: a GPU's kernel never needs it)."""
        self.fn = fn
        self.spec = spec
        self.options = options
        # What the kernel reads, as it is now (as Numba freezes the globals it reads when
        # it compiles): every compile and the simulator start from this copy, and the
        # cache key is taken of it.  Needs no Numba.
        self.snapshot = freeze(fn)
        self.source_key = function_fingerprint(self.snapshot.function, spec.describe())
        self._compiled: dict[str, CompiledKernel] = {}
        self._cooperative: bool | None = None
        self._lock = threading.Lock()
        self._checked: Any = None  # pnex_magic.checking.CheckedKernel, made on first use
        self._forms: dict[tuple, types.FunctionType] = {}  # (for what, checked[, variant]) -> function
        self._simulate = simulate
        self.toolchain_error: str | None = None
        self.flops: Any = None  # the FLOP count of a call (pnex_magic.roofline.FlopCount), from flops=

    @property
    def hidden_arrays(self) -> tuple[HiddenArray, ...]:
        """The device arrays the kernel reads as globals (or closure variables), by name:
        its trailing parameters, after the error record of a checked launch, which every
        launcher passes (:mod:`pnex_magic.snapshot`)."""
        return self.snapshot.hidden

    @functools.cached_property
    def op_name(self) -> str:
        """Deterministic operator name: the kernel's name plus a short hash of where
        it was defined, so a re-run definition replaces its op.  A kernel made by a
        factory (``def make(dtype): @pnex.jit ... def k(...)``) is defined at one place
        for every call: the values of its closure variables are part of its site, so
        that ``make("f16")`` and ``make("bf16")`` are two ops, not one replacing the other."""
        site = f"{self.spec.module}.{self.spec.qualname}"
        if self.fn.__closure__:
            site += "\n" + closure_token(self.fn)
        return f"{self.spec.name}_{hashlib.sha256(site.encode()).hexdigest()[:8]}"

    def target_arch(self, arch: str | None = None) -> str:
        """The architecture to compile for: ``arch``, else the definition's, else the default
        (:func:`~pnex_magic.arch.default_arch`).  A kernel that calls tensor-core primitives
        (:mod:`pnex_magic.tc`) needs sm_80 or newer, one that calls ``wgmma`` sm_90 exactly:
        where the default is a stand-in (no GPU) it becomes that; a named or present GPU
        without the primitive is refused, naming it.  So for thread-block clusters
        (``cluster_dims``), which need sm_90."""
        explicit = arch or self.options.arch
        cc = parse_arch(explicit or default_arch())
        needed = self.required_cc
        lowest = max(needed[0] if needed else (0, 0), clusters.MIN_CC if self.spec.cluster_dims else (0, 0))
        if cc < lowest and explicit is None and default_is_stand_in():
            cc = lowest
        problem = clusters.arch_problem(self.spec.name, self.spec.cluster_dims, cc)
        if problem is not None:
            raise KernelDefinitionError(problem + ("" if explicit else " (this GPU)"))
        if self._rank_problem:
            raise KernelDefinitionError(f"kernel {self.spec.name!r}, {self._rank_problem}")
        if needed is not None:
            from .tc.usage import arch_problem

            problem = arch_problem(self.snapshot.function, cc)
            if problem is not None:
                raise KernelDefinitionError(
                    f"kernel {self.spec.name!r} {problem}; it cannot be compiled for {arch_name(cc)}"
                    + ("" if explicit else " (this GPU)")
                )
        return arch_name(cc)

    @functools.cached_property
    def _rank_problem(self) -> str | None:
        """A constant CTA rank or multicast mask outside the kernel's clusters
        (:func:`pnex_magic.tc.usage.cluster_rank_problem`); only for a kernel that calls one."""
        if not {"tma_load_multicast", "mbarrier_arrive_cluster"} & self._primitives:
            return None
        from .tc.usage import cluster_rank_problem

        dims = self.spec.cluster_dims or (1, 1, 1)
        return cluster_rank_problem(self.snapshot.function, dims[0] * dims[1] * dims[2])

    @functools.cached_property
    def _primitives(self) -> set[str]:
        from .tc.usage import used_primitives

        return used_primitives(self.snapshot.function)

    @functools.cached_property
    def required_cc(self) -> tuple[tuple[int, int], str] | None:
        """The oldest architecture that has every tensor-core primitive the kernel calls,
        and one that needs it (:func:`pnex_magic.tc.usage.required_cc`)."""
        from .tc.usage import required_cc

        return required_cc(self.snapshot.function)

    def cache_key(self, arch: str, layout: str = "C", variant: int = 0, checked: bool = False) -> str:
        parts = [self.source_key, arch, layout, f"max_registers={self.options.max_registers}",
                 toolchain_versions(use_cache=self.options.use_cache), "lineinfo"]
        if self.spec.tune_params:
            parts.append(f"tune={self.spec.tune_values(variant)!r}")
        if checked:
            parts.append("checked, accesses proven in bounds left unchecked")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def checked_kernel(self) -> Any:
        """The kernel's checked variant (:func:`pnex_magic.checking.checked_kernel`): every
        array access tested against its array's shape, the first violation recorded.
        Raises ``KernelDefinitionError`` when the kernel's source cannot be read."""
        if self._checked is None:
            self._checked = _checking().checked_kernel(self.snapshot.function, self.spec, self.snapshot.hidden_names)
        return self._checked

    def spec_for(self, checked: bool) -> KernelSpec:
        """The spec the compile stage and the launchers take: the kernel's, or with
        ``checked`` its checked variant's (the error record a trailing parameter,
        :func:`pnex_magic.checking.checked_spec`)."""
        return _checking().checked_spec(self.spec) if checked else self.spec

    def kernel_function(self, checked: bool) -> types.FunctionType:
        """The snapshot's kernel with its hidden arguments as trailing parameters (after
        the error record when ``checked``), its device functions still frozen."""
        if checked:
            return self.checked_kernel().function
        if not self.snapshot.hidden:
            return self.snapshot.function
        return _checking().with_parameters(self.snapshot.function, self.snapshot.hidden_names)

    def compile_function(self, checked: bool = False) -> types.FunctionType:
        """The function Numba compiles (:func:`pnex_magic.snapshot.compilable`): made once,
        when first compiled (a cache hit needs none)."""
        key = ("compile", checked)
        if key not in self._forms:
            from . import warmup

            warmup.wait()  # imports Numba: never beside the background warm-up's import
            self._forms[key] = compilable(self.kernel_function(checked))
        return self._forms[key]

    def violation_error(self, record: Any) -> Exception | None:
        """The ``KernelIndexError`` a checked launch whose record (:mod:`pnex_magic.checking`)
        holds a violation raises; ``None`` when it holds none."""
        return _checking().violation_error(self.spec.name, [int(v) for v in record], self.checked_kernel().sites)

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
        record after the kernel's parameters (and before its :attr:`hidden_arrays`)."""
        arch = self.target_arch(arch)
        with self._lock:
            found = self._compiled.get((arch, layout, variant, checked))
            if found is not None and not force:
                return found
            spec, cache_id = self.spec_for(checked), self.options.cache_id
            if checked:
                cache_id = None if cache_id is None else f"{cache_id}-checked"
            # lazy: keeps the cache-hit path (and a loaded artifact's) free of Numba's compiler
            from .compiler import compile_kernel

            result = compile_kernel(
                None,
                spec,
                arch=arch,
                key=self.cache_key(arch, layout, variant, checked),
                max_registers=self.options.max_registers,
                cache_id=cache_id,
                use_cache=self.options.use_cache,
                refresh=force or self.options.force,
                layout=layout,
                variant=variant,
                hidden=self.snapshot.hidden,
                make_fn=functools.partial(self.compile_function, checked),
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

    @property
    def cooperative(self) -> bool:
        """Whether the kernel synchronises its whole grid (``cuda.cg.this_grid().sync()``),
        so that GPU launchers launch it cooperatively, every block resident at once
        (read from its compiled code; ``False`` for a kernel that does not compile here)."""
        if self.toolchain_error is not None:
            return False
        if self._cooperative is None:  # the same for every architecture: asked at every launch
            self._cooperative = self.compiled().cooperative
        return self._cooperative

    def compiled_if_available(self) -> CompiledKernel | None:
        return next(iter(self._compiled.values()), None)

    def check_shared_memory(self) -> None:
        """Refuse a ``shared_bytes`` above what a block may use on the target GPU, where
        that GPU is known (``arch=``, ``$PNEX_ARCH`` or the GPU present; without one the
        kernel may be meant for a larger GPU, and the simulator runs it whatever its
        size).  The launch checks the device's own limit less the kernel's static shared
        memory, by the driver's figures (:mod:`pnex_magic.launch.shared`)."""
        spec = self.spec
        if not any(spec.shared_per_variant) or (self.options.arch is None and default_is_stand_in()):
            return
        arch = self.target_arch()
        most = max_shared_per_block(arch)
        if most is None:
            return
        for variant, asked in enumerate(spec.shared_per_variant):
            if asked <= most:
                continue
            values = spec.tune_values(variant)
            setting = ", ".join(f"{n}={values[n]!r}" for n in sorted(spec.shared_bytes.names()))
            raise KernelDefinitionError(
                f"kernel {spec.name!r}: shared_bytes = {spec.shared_bytes} gives {asked:,} B of dynamic shared memory "
                f"per block{f' with the Tune choice {setting}' if setting else ''}, but a block may use at most "
                f"{most:,} B on {arch}" + (" (this GPU)" if self.options.arch is None else "")
                + "; use fewer pipeline stages or smaller tiles" + (", or remove that choice" if setting else "")
            )

    def check_compiles(self) -> CompiledKernel | None:
        """Compile for the target architecture at definition time, so typing errors
        surface there.  A missing CUDA compiler (no NVVM wheel) is not an error: the
        op still runs on CPU tensors through the simulator (and it is said once)."""
        if self.options.check:
            self.checked_kernel()  # a kernel without source cannot be checked: say so now
        self.check_shared_memory()
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

    def simulated_function(self, checked: bool = False, variant: int = 0) -> types.FunctionType:
        """The kernel as the CUDA simulator runs it (:func:`pnex_magic.snapshot.simulable`):
        the snapshot's, with its hidden arguments as trailing parameters and its
        ``@cuda.jit(device=True)`` functions simulated, rewritten so that it computes
        with Numba-CUDA's types for the parameter types the GPU compile is given
        (``variant``: the values of the ``Tune`` parameters); ``checked``: the checked
        variant's (:meth:`checked_kernel`), which takes the error record after the
        kernel's parameters.  Made on the first call, by the simulator's stage
        (:func:`pnex_magic.simtyping.forms.simulated_function`, given to the definition
        as ``simulate``), which imports Numba; memoised.

        Raises
        ------
        KernelLaunchError
            The kernel calls CUDA C++ (``cuda.declare_device``), which runs on a GPU only,
            or does what the simulator cannot compute as Numba-CUDA does.
        KernelTypingError
            Numba cannot type the kernel (the GPU compile fails too).
        """
        from . import warmup

        # Never import Numba beside the background warm-up (%load_ext): an import of the
        # simulator racing it failed with "cannot import name" in a cell run at once.
        warmup.wait()
        key = ("simulate", checked, variant)
        with self._lock:
            if key not in self._forms:
                self._forms[key] = self._simulate(self, checked, variant)
            return self._forms[key]
