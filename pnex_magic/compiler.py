"""Compile stage: a kernel function and its spec become PTX, a cubin and a
resource report, for one GPU architecture.

Numba-CUDA types the kernel and emits PTX through NVVM; nvJitLink
(:mod:`pnex_magic.linking`) assembles it into a cubin for the target architecture
and reports registers, shared, local and constant memory, straight from ptxas.
Neither step needs a GPU or a CUDA driver: the compiler libraries come as pip
wheels (``numba-cuda[cu12]`` / ``numba-cuda[cu13]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import cache, clusters, numbasetup, vector, warmup
from . import random as kernel_random
from .arch import arch_name, parse_arch
from .cubin import kernel_entry
from .errors import COMPILER_LOG_NOTE, KernelCompileError, KernelDefinitionError, KernelTypingError
from .linking import (
    arch_specific, has_external_calls, link_cubin, link_lto_cubin, linker_classes, object_code, probe_linker,
    ptx_entry, uses_grid_sync,
)
from .numbadriver import numba_error_line, target_device
from .spec import KernelSpec, ScalarParam, SeedParam, TensorParam, TuneParam
from .tc import lowering as tc_lowering

__all__ = [
    "ResourceUsage",
    "CompiledKernel",
    "compile_kernel",
    "abi_layout",
    "numba_signature",
    "link_cubin",
    "ltoir_objects",
    "probe_linker",
    "numba_error_line",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ResourceUsage:
    """Per-kernel figures reported by ptxas (through nvJitLink)."""

    registers: int
    shared_bytes: int
    local_bytes: int
    const_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_store_bytes or self.spill_load_bytes)


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """The result of compiling one kernel for one architecture."""

    arch: str
    entry: str  # the PTX entry (mangled kernel name)
    ptx: str
    cubin: bytes | None  # None where nvJitLink is unavailable
    resources: ResourceUsage | None
    link_log: str
    key: str
    cache_hit: bool
    compile_seconds: float
    max_registers: int | None
    layout: str = "C"  # of the input arrays: "C" contiguous, "A" any strides
    variant: int = 0  # the values of the Tune parameters: KernelSpec.tune_variants[variant]
    #: The kernel synchronises its whole grid (cuda.cg.this_grid().sync()): its cubin links
    #: CUDA's device runtime, and it must be launched cooperatively (every block resident).
    cooperative: bool = False

    @property
    def ptx_params(self) -> list[int]:
        return _ptx_param_sizes(self.ptx, self.entry)


def numba_signature(spec: KernelSpec, layout: str = "C", variant: int = 0, hidden: Sequence[Any] = ()) -> tuple[Any, ...]:
    """Numba types of the kernel's parameters: input tensors as arrays of ``layout``
    (``"C"``: C-contiguous, the fast variant whose loads are ``ld.global``; ``"A"``: any
    strides, for views and transposes, whose loads are generic), ``In`` tensors
    read-only (a write to one fails to compile), outputs as C-contiguous arrays (they
    are allocated contiguous), scalars as their type, unused parameters as ``none``,
    a ``Seed`` as a read-only one-element uint64 array, and ``Tune`` parameters as the
    value of ``variant`` (:attr:`KernelSpec.tune_variants`),
    ``Omitted``: Numba's type for an argument left to its default, which it lowers as a
    compile-time constant and passes no slot for; then the ``hidden`` arguments
    (:class:`~pnex_magic.snapshot.HiddenArray`: device arrays the kernel reads as
    globals), writable arrays of the layout they had at definition."""
    from numba.cuda import types as nbtypes

    values = spec.tune_values(variant)
    sig = []
    for p in spec.params:
        if isinstance(p, TuneParam):
            sig.append(nbtypes.Omitted(values[p.name]))
            continue
        if isinstance(p, TensorParam):
            sig.append(
                nbtypes.Array(
                    p.dtype.numba_type(), p.ndim, "C" if p.role == "out" else layout, readonly=p.role == "in"
                )
            )
        elif isinstance(p, ScalarParam):
            sig.append(p.dtype.numba_type())
        elif isinstance(p, SeedParam):  # the seed drawn for this call: a one-element uint64 array
            sig.append(nbtypes.Array(nbtypes.uint64, 1, "C", readonly=True))
        else:
            sig.append(nbtypes.none)
    for h in hidden:
        sig.append(nbtypes.Array(h.dtype.numba_type(), h.ndim, h.layout))
    return tuple(sig)


def abi_layout(spec: KernelSpec, hidden: Sequence[Any] = ()) -> list[list[int]]:
    """Byte sizes of the flattened kernel parameters Numba's ABI expects, one list
    per parameter: an array (a ``Seed`` too) is (meminfo, parent, nitems, itemsize, data,
    shape..., strides...), a scalar its own size, an unused parameter one 8-byte slot, a ``Tune``
    parameter none (it is a constant in the code); then the ``hidden`` arrays."""
    layout = []
    for p in spec.params:
        if isinstance(p, TuneParam):
            layout.append([])
        elif isinstance(p, TensorParam):
            layout.append([8] * (5 + 2 * p.ndim))
        elif isinstance(p, SeedParam):
            layout.append([8] * 7)  # a 1-D array
        elif isinstance(p, ScalarParam):
            layout.append([p.dtype.itemsize])
        else:
            layout.append([8])
    layout += [[8] * (5 + 2 * h.ndim) for h in hidden]
    return layout


_PTX_SIZES = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4, "f32": 4,
              "u16": 2, "s16": 2, "b16": 2, "f16": 2, "u8": 1, "s8": 1, "b8": 1}


def _ptx_param_sizes(ptx: str, entry: str) -> list[int]:
    start = ptx.find(f".entry {entry}(")
    if start < 0:
        return []
    end = ptx.find(")", start)
    return [_PTX_SIZES[t] for t in re.findall(r"\.param\s+\.(\w+)\s", ptx[start:end])]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Numba's typing error for an xoroshiro128p_* function given a plain array: it reads the
# record's fields s0 and s1 by name.
_XOROSHIRO_RE = re.compile(r"getitem\(array\((?:u?int\d+|float\d+)[^)]*\), (?:Literal\[str\]|unicode_type)\(?s[01]\)?|xoroshiro128p")


def _condense_numba_error(exc: BaseException) -> str:
    """Numba's typing errors list every candidate overload; keep what says what is wrong."""
    lines = [line.rstrip() for line in _ANSI.sub("", str(exc)).splitlines()]
    keep: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("*") or "candidate implementations" in stripped:
            if keep and "candidate implementations" in stripped:
                break
            continue
        if stripped.startswith(("Failed in cuda mode pipeline", "During: Pass")):
            continue
        keep.append(stripped)
        if len(keep) >= 4:
            break
    # pnex's own kernel helpers (pnex.vload, pnex.vstore) say what is wrong in their message:
    # the first such line first (Numba then retries without literals, and says so too).
    own = [m.group(1) for m in (re.match(r"\s*\w*Error: (pnex\.\w+.*)", ln) for ln in lines) if m]
    if own:
        keep = [own[0], *[ln for ln in keep if ln != own[0]][:3]]
    specific = [ln.strip() for ln in lines if re.match(r"\s*(Numba\w*Error|TypeError|NameError|KeyError):", ln)]
    for line in specific[:2]:
        if line not in keep:
            keep.append(line)
    return "\n  ".join(keep) or type(exc).__name__


def _kernel_line(exc: BaseException, fn: Callable) -> int | None:
    """The line of the kernel's file that Numba was typing when it failed."""
    filename = fn.__code__.co_filename
    for m in re.finditer(r'File "([^"]+)", line (\d+)', str(exc)):
        if m.group(1) == filename:
            return int(m.group(2))
    return numba_error_line(exc, filename)



def _numba_ptx(
    fn: Callable, spec: KernelSpec, cc: tuple[int, int], layout: str, variant: int = 0, hidden: Sequence[Any] = ()
) -> tuple[str, str]:
    warmup.wait()  # never beside the background warm-up (%load_ext): it does this first compile's set-up
    from numba import cuda

    vector.register_cuda()  # pnex.vload / pnex.vstore in kernels
    kernel_random.register_cuda()  # pnex.random in kernels
    tc_lowering.register_cuda()  # pnex.tc (tensor cores) in kernels
    sig = numba_signature(spec, layout, variant, hidden)
    bounds = launch_bounds(fn, spec)
    try:
        numbasetup.typing_setup()  # the first compile's typing set-up, cheaper than Numba's own (see there)
        with warnings.catch_warnings(), target_device(cc), clusters.annotations(spec.cluster_dims):
            warnings.simplefilter("ignore")
            # Line info (``.loc``): ncu's source view and compute-sanitizer name the Python line;
            # it leaves registers and SASS unchanged (measured, benchmarks/checked_overhead.py).
            try:
                ptx, _ = cuda.compile(fn, sig, device=False, abi="numba", cc=cc, output="ptx", lineinfo=True,
                                      launch_bounds=bounds)
            except Exception as exc:  # noqa: BLE001 - NVVM's error type is numba's
                if "ERROR_COMPILATION" not in str(exc):
                    raise
                # NVVM (CUDA 12.9 and 13) rejects some valid kernels only when they carry line
                # info, with no log: loops around float comparisons, found by the derived
                # backward's randomised check (tests/test_adjoint_random.py).  Without it.
                ptx, _ = cuda.compile(fn, sig, device=False, abi="numba", cc=cc, output="ptx", lineinfo=False,
                                      launch_bounds=bounds)
                log.info("pnex: kernel %r: NVVM failed with line info; compiled without it", spec.name)
    except Exception as exc:  # numba raises many types; classify by what they are
        name = type(exc).__name__
        if name in ("TypingError", "UnsupportedError", "NumbaTypeError", "UnsupportedBytecodeError") or "Typing" in name:
            line = _kernel_line(exc, fn)
            at = f" (line {line})" if line else ""
            hint = ""
            if _XOROSHIRO_RE.search(str(exc)):
                hint = (
                    "\nNumba's xoroshiro128p_* functions take an array of xoroshiro128p records, which torch has no "
                    "dtype for: declare the states InMut('xoroshiro128p', (None,)) and pass "
                    "pnex.xoroshiro128p_states(n, seed, device), a (n, 2) uint64 tensor the kernel sees as n states"
                )
            elif "readonly array" in str(exc) and ("setitem" in str(exc) or "atomic" in str(exc)):
                readonly = ", ".join(p.name for p in spec.params if getattr(p, "role", "") == "in")
                hint = (
                    f"\nIn parameters ({readonly}) are read-only: declare a parameter InMut(...) "
                    f"if the kernel writes to it"
                )
            names = [p.name for p in spec.params] + [f"{h.name} (a global device array)" for h in hidden]
            sig_text = ", ".join(f"{name}: {t}" for name, t in zip(names, sig))
            raise KernelTypingError(
                f"kernel {spec.name!r}{at}: Numba could not compile the kernel body for the declared "
                f"parameter types ({sig_text}):\n  {_condense_numba_error(exc)}{hint}\n{COMPILER_LOG_NOTE}",
                compiler_log=str(exc),
                lineno=line,
            ) from None
        if "NVVM" in name or "nvvm" in str(exc).lower() or "libnvvm" in str(exc).lower():
            raise KernelCompileError(
                f"kernel {spec.name!r}: NVVM failed for {arch_name(cc)}: {str(exc).strip().splitlines()[0]}. "
                f"Is the architecture supported by the installed CUDA compiler wheels "
                f"(pip install 'numba-cuda[cu12]' or '[cu13]')?",
                compiler_log=str(exc),
            ) from None
        raise KernelCompileError(
            f"kernel {spec.name!r}: compilation failed: {type(exc).__name__}: {str(exc).strip()[:500]}",
            compiler_log=str(exc),
        ) from None
    entry = ptx_entry(ptx)
    if entry is None:
        raise KernelCompileError(f"kernel {spec.name!r}: Numba's PTX has no kernel entry", compiler_log=ptx)
    return ptx, entry


# nvJitLink's per-kernel summary, e.g. "info    : used 71 registers, used 1 barriers, 0 stack,
# 800 bytes smem, 496 bytes cmem[0], 8 bytes cmem[2], 0 bytes lmem".  Fields are read one by one:
# which ones appear (other constant banks, for instance) varies with the kernel.
_SUMMARY_RE = re.compile(r"^\s*info\s*:\s*used (\d+) registers\b.*$", re.MULTILINE)
_PTXAS_RE = re.compile(r"\b[Uu]sed (\d+) registers\b.*$", re.MULTILINE)
_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _field(line: str, pattern: str) -> int:
    m = re.search(pattern, line)
    return int(m.group(1)) if m else 0


def _parse_resources(log: str) -> ResourceUsage | None:
    m = _SUMMARY_RE.search(log) or _PTXAS_RE.search(log)
    if m is None:
        return None
    line = m.group(0)
    stack = _field(line, r"(\d+) stack\b")
    spill = _SPILL_RE.search(log)
    frame, stores, loads = map(int, spill.groups()) if spill else (stack, 0, 0)
    return ResourceUsage(
        registers=int(m.group(1)),
        shared_bytes=_field(line, r"(\d+) bytes smem"),
        local_bytes=max(_field(line, r"(\d+) bytes lmem"), frame),
        const_bytes=_field(line, r"(\d+) bytes cmem\[0\]"),
        stack_bytes=stack,
        spill_store_bytes=stores,
        spill_load_bytes=loads,
        barriers=_field(line, r"used (\d+) barriers"),
    )


def launch_bounds(fn: Callable, spec: KernelSpec) -> tuple[int] | None:
    """``(threads per block,)`` for a kernel that moves registers between its warpgroups
    (``pnex.tc.setmaxnreg_inc``/``_dec``): ptxas gives the code after ``setmaxnreg.inc``
    the registers it names only when the kernel declares its block size (``.maxntid``,
    CUDA's ``__launch_bounds__``); a register cap (``max_registers``) would bind every
    warpgroup to it and spill.  ``None`` for every other kernel (their code is unchanged).
    A kernel's cluster shape (``cluster_dims``) is written beside these, by
    :func:`pnex_magic.clusters.annotations` around the compile."""
    from .tc.usage import used_primitives

    if not {"setmaxnreg_inc", "setmaxnreg_dec"} & used_primitives(fn):
        return None
    blocks = {math.prod(block) for block in spec.block_candidates}
    if len(blocks) != 1:
        raise KernelDefinitionError(
            f"kernel {spec.name!r} calls pnex.tc.setmaxnreg_*, whose register budgets hold for one block size; "
            f"give threads_per_block one value (it has {sorted(blocks)})"
        )
    return (blocks.pop(),)


def ltoir_objects(
    fn: Callable, spec: KernelSpec, cc: tuple[int, int], layout: str = "C", variant: int = 0, hidden: Sequence[Any] = (),
    ptx: str = "", lineinfo: bool = False,
) -> list[Any]:
    """The kernel and the code it links against (float16/bfloat16 operators,
    ``declare_device`` functions with ``link=``, and the Numba-CUDA helpers its ``ptx``
    calls), as LTO-IR objects for nvJitLink: the kernel through NVVM, CUDA C++ sources
    through NVRTC (neither needs a driver).  ``lineinfo``: the kernel's line table, for
    a kernel that links against nothing (its PTX has no external call): NVRTC's LTO-IR
    of the float16/bfloat16 helpers has no debug module flags, and nvJitLink refuses to
    link modules whose flags conflict ("'Debug Info Version': IDs have conflicting
    behaviors")."""
    warmup.wait()
    from numba import cuda

    _, _, ObjectCode = linker_classes()
    numbasetup.typing_setup()
    try:
        with warnings.catch_warnings(), target_device(cc), clusters.annotations(spec.cluster_dims), \
                _without_debug_subroutines():
            warnings.simplefilter("ignore")
            codes, _ = cuda.compile_all(
                fn, numba_signature(spec, layout, variant, hidden), device=False, abi="numba", cc=cc, output="ltoir",
                launch_bounds=launch_bounds(fn, spec), lineinfo=lineinfo,
            )
    except Exception as exc:
        raise KernelCompileError(
            f"kernel {spec.name!r}: could not compile the code it links against (float16/bfloat16 "
            f"operators or declare_device functions): {type(exc).__name__}: {str(exc).strip()[:500]}",
            compiler_log=str(exc),
        ) from None
    kernel = ObjectCode.from_ltoir(codes[0]) if isinstance(codes[0], bytes) else object_code(codes[0], spec.name)
    return [kernel, *(object_code(code, spec.name) for code in codes[1:]), *_numba_helpers(ptx, cc, spec.name)]


@contextlib.contextmanager
def _without_debug_subroutines():
    """Numba keeps the subroutines it compiled (operators' implementations) per target
    context, keyed without the debug options: after a compile with line info, a compile
    without would reuse them, with their debug module flags.  While this is active, a
    compile starts from none (pnex's compiles are serialised by ``target_device``)."""
    try:
        from numba.cuda.descriptor import cuda_target

        context = cuda_target.target_context
    except Exception:  # another numba-cuda layout: nothing to isolate
        yield
        return
    saved = context.cached_internal_func
    context.cached_internal_func = {}
    try:
        yield
    finally:
        context.cached_internal_func = saved


def _link_dependencies(
    fn: Callable, spec: KernelSpec, cc: tuple[int, int], ptx: str, layout: str = "C", variant: int = 0,
    hidden: Sequence[Any] = (),
) -> list[Any]:
    """Code the kernel's PTX calls but does not contain, for nvJitLink.

    Numba-CUDA implements float16/bfloat16 arithmetic (and ``declare_device``
    functions with ``link=``) as external functions whose CUDA C++ or binary code is
    linked in at load time; ``cuda.compile`` returns only the kernel's own PTX.  Only
    a kernel whose PTX declares external functions pays for this second pass."""
    if not has_external_calls(ptx):
        return []
    return ltoir_objects(fn, spec, cc, layout, variant, hidden, ptx)[1:]


# Numba-CUDA's own device helpers, which its dispatcher links when a kernel's code calls
# them (numba/cuda/dispatcher.py, link_to_library_functions) and cuda.compile_all does not
# list: the copy-free ``reshape`` of an array (a tile carved from a shared array, say).
_NUMBA_HELPERS = {"reshape_funcs.cu": ("numba_attempt_nocopy_reshape", "nocopy_empty_reshape")}


def _numba_helpers(ptx: str, cc: tuple[int, int], kernel: str) -> list[Any]:
    """LTO-IR (through NVRTC) of the Numba-CUDA helper sources the kernel's PTX calls."""
    wanted = [source for source, names in _NUMBA_HELPERS.items() if any(name in ptx for name in names)]
    if not wanted:
        return []
    from numba import cuda
    from numba.cuda.cudadrv import nvrtc

    _, _, ObjectCode = linker_classes()
    folder = Path(cuda.__file__).resolve().parent
    objects = []
    for source in wanted:
        code, _ = nvrtc.compile((folder / source).read_text(), source, cc, ltoir=True)
        objects.append(ObjectCode.from_ltoir(code) if isinstance(code, bytes) else object_code(code, kernel))
    return objects


def compile_kernel(
    fn: Callable | None,
    spec: KernelSpec,
    *,
    arch: str,
    key: str,
    max_registers: int | None = None,
    cache_id: str | None = None,
    use_cache: bool = True,
    layout: str = "C",
    refresh: bool = False,
    variant: int = 0,
    hidden: Sequence[Any] = (),
    make_fn: Callable[[], Callable] | None = None,
) -> CompiledKernel:
    """PTX, cubin and resources of ``fn`` (``None``: the function ``make_fn()`` makes,
    on a cache miss only) for ``arch`` (``variant``: which values of
    the ``Tune`` parameters, see :attr:`KernelSpec.tune_variants`; ``hidden``: the
    device arrays ``fn`` takes after the spec's parameters, see :func:`numba_signature`);
    served from the disk cache when ``key`` (which must cover everything that changes
    the result) matches."""
    cc = parse_arch(arch)
    arch = arch_name(cc)
    if cache_id and layout != "C":
        cache_id = f"{cache_id}-strided"  # both layouts of one kernel share its cache_id
    if cache_id and variant:
        cache_id = f"{cache_id}-v{variant}"
    if use_cache and not refresh:
        entry = cache.load(key, cache_id)
        if entry is not None:
            ptx = entry.read_text("kernel.ptx")
            if ptx is not None:
                res = entry.meta.get("resources")
                return CompiledKernel(
                    arch=arch,
                    entry=entry.meta["entry"],
                    ptx=ptx,
                    cubin=entry.read_bytes("kernel.cubin"),
                    resources=ResourceUsage(**res) if res else None,
                    link_log=entry.read_text("link.log") or "",
                    key=key,
                    cache_hit=True,
                    compile_seconds=0.0,
                    max_registers=max_registers,
                    layout=layout,
                    variant=variant,
                    cooperative=bool(entry.meta["cooperative"] if "cooperative" in entry.meta else uses_grid_sync(ptx)),
                )
    with numbasetup.first_compile_frozen():  # the first compile's full collections: its own objects only
        compiled = _compile_new(fn, spec, arch, cc, key, max_registers, cache_id, use_cache, layout, variant, hidden,
                                make_fn)
    numbasetup.first_compile_ran()
    return compiled


def _compile_new(
    fn: Callable | None, spec: KernelSpec, arch: str, cc: tuple[int, int], key: str, max_registers: int | None,
    cache_id: str | None, use_cache: bool, layout: str, variant: int, hidden: Sequence[Any],
    make_fn: Callable[[], Callable] | None,
) -> CompiledKernel:
    """:func:`compile_kernel` on a cache miss: Numba, the link, the cache's store."""
    start = time.perf_counter()
    if fn is None:
        fn = make_fn()
    ptx, entry_name = _numba_ptx(fn, spec, cc, layout, variant, hidden)
    expected = [size for sizes in abi_layout(spec, hidden) for size in sizes]
    found = _ptx_param_sizes(ptx, entry_name)
    if found != expected:
        raise KernelCompileError(
            f"kernel {spec.name!r}: the compiled kernel's parameters ({found}) do not match the layout pnex "
            f"passes ({expected}); this numba-cuda version changed its kernel ABI. Please report it.",
            compiler_log=ptx,
        )
    cubin: bytes | None
    ptx, link_arch = arch_specific(ptx, arch)  # wgmma: sm_90a
    try:
        if link_arch != arch:  # wgmma: linked from LTO-IR, as one program (see link_lto_cubin)
            objects = ltoir_objects(fn, spec, cc, layout, variant, hidden, lineinfo=not has_external_calls(ptx))
            cubin, log = link_lto_cubin(objects, link_arch, max_registers, spec.name)
            entry_name = kernel_entry(cubin, entry_name)  # a second compile: Numba's mangled name differs
        else:
            cubin, log = link_cubin(
                ptx, link_arch, max_registers, spec.name, _link_dependencies(fn, spec, cc, ptx, layout, variant, hidden)
            )
    except KernelCompileError:
        raise
    except (ImportError, RuntimeError, OSError) as exc:
        cubin, log = None, f"nvJitLink unavailable: {exc}"
    resources = _parse_resources(log) if cubin else None
    seconds = time.perf_counter() - start
    compiled = CompiledKernel(
        arch=arch,
        entry=entry_name,
        ptx=ptx,
        cubin=cubin,
        resources=resources,
        link_log=log,
        key=key,
        cache_hit=False,
        compile_seconds=seconds,
        max_registers=max_registers,
        layout=layout,
        variant=variant,
        cooperative=uses_grid_sync(ptx),
    )
    if use_cache:
        files: dict[str, str | bytes] = {"kernel.ptx": ptx, "link.log": log}
        if cubin is not None:
            files["kernel.cubin"] = cubin
        cache.store(
            key,
            {
                "kernel": f"{spec.module}.{spec.qualname}",
                "entry": entry_name,
                "arch": arch,
                "layout": layout,
                "tune": {k: v for k, v in spec.tune_values(variant).items()},
                "resources": dataclasses.asdict(resources) if resources else None,
                "cooperative": compiled.cooperative,
                "compile_seconds": seconds,
            },
            files,
            cache_id,
        )
    return compiled
