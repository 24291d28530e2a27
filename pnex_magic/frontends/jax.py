"""The JAX front end's launch: the ``pnex_launch`` primitive, its lowerings, its checks.

What :mod:`pnex_magic.frontends.jax_op` (the user-facing ``jax_op``) traces a call
into: :func:`run` checks the call and binds one ``pnex_launch`` primitive, which each
platform lowers its own way.

What runs where
---------------
* **Trace time** (once per shapes and scalar values; eager calls are traced and
  cached too, through an inner ``jax.jit``): the arguments are checked by the core,
  :func:`pnex_magic.calls.launch_info` on ``torch.empty(..., device="meta")`` stand-ins
  of the arrays, so wrong dtypes, ranks and sizes raise the same exceptions with the
  same messages as the PyTorch op; output shapes, ``n_threads`` and the grid come
  from there too and are fixed in the trace.  Scalars must be concrete Python
  numbers: under ``jax.jit``, mark them static (``static_argnums``) or bind them with
  ``functools.partial``.
* **One primitive, lowered per platform.**  A call binds the ``pnex_launch``
  primitive; when JAX lowers the computation for a platform it picks that
  platform's rule, so the compiled program holds one launch and no conditional.
* **On a GPU** (the ``cuda`` platform): a custom call of pnex's one XLA FFI
  handler (:mod:`pnex_magic.launch.xla`), which launches the kernel's cubin on
  XLA's stream, with XLA's buffers, on whichever device the computation runs.
  Until the handler is built (its build runs in the background, started by the
  first GPU trace) and where it cannot be, the trace lowers to a
  ``jax.experimental.buffer_callback`` instead, which launches the same cubin through
  pnex's Python driver launcher on XLA's buffers and stream; traces made once it is
  built use it.  Each
  ``InMut`` argument is aliased to its result (``input_output_aliases``): the
  kernel writes it in place, and XLA copies it first unless the caller donates it
  (``jax.jit(..., donate_argnums=...)``) or it is a loop carry the result goes back
  to.  An ``Out(init=...)`` is filled by the handler with a memset on XLA's stream
  (no extra operand, no extra pass), except a value no 1, 2 or 4-byte pattern
  repeats into (a float64 such as ``1.5``), which XLA fills in a buffer aliased to
  the result.  The handler loads the kernel when XLA builds the executable and only
  launches per call; it is marked command-buffer compatible.
* **Elsewhere** (the CPU backend, CI): ``jax.pure_callback`` runs the same kernel
  through numba-cuda's CUDA simulator on CPU tensors.
* **The block shape** of an autotuned kernel is the PyTorch op's choice for the
  call's key (:mod:`pnex_magic.launch.autotune`: in this process or on disk for the
  GPU model).  An eager call on concrete GPU arrays of a key not tuned yet first
  tunes it by running the PyTorch op on zero-copy DLPack views of the arrays (of
  copies of the ``InMut`` ones); a trace under ``jax.jit`` that finds no choice
  launches the first candidate and warns once.

The launch as seen from JAX (results, gradients, vmap, loops) is described in
:mod:`pnex_magic.frontends.jax_op`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

try:
    import jax
    import jax.core as core
    import jax.numpy as jnp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pnex_magic's JAX front end needs JAX: pip install 'pnex_magic[jax]' (CPU), or JAX with its CUDA "
        "plugin on a GPU machine (pip install 'jax[cuda13]')"
    ) from exc
import numpy as np
import torch
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from ..calls import LaunchInfo, launch_info
from ..definition import KernelDefinition
from ..errors import ArgumentShapeError, ArgumentTypeError, KernelCompileError
from ..launch import autotune, launcher_for, xla
from ..op import PnexOp
from ..spec import KernelSpec, ScalarParam, TensorParam

__all__ = ["LaunchChoice", "check_call", "eager_choice", "run"]

log = logging.getLogger(__name__)

_CACHE_SIZE = 64  # jitted single launches kept (the impl rule outside any trace)


# ---------------------------------------------------------------------------- checks


def _torch_dtype(dtype: Any) -> torch.dtype | None:
    found = getattr(torch, np.dtype(dtype).name, None)
    return found if isinstance(found, torch.dtype) else None


def _x64() -> bool:
    """Whether JAX makes 64-bit arrays here (``jax_enable_x64``, or a local override)."""
    try:
        return jax.dtypes.canonicalize_dtype(np.int64) == np.dtype(np.int64)
    except AttributeError:  # a JAX without jax.dtypes.canonicalize_dtype
        return bool(jax.config.read("jax_enable_x64"))


def _x64_hint(p: TensorParam) -> str:
    if p.dtype.storage_itemsize == 8 and not _x64():
        return (
            ". JAX makes 32-bit arrays unless 64-bit types are enabled: "
            "jax.config.update('jax_enable_x64', True)"
        )
    return ""


def check_call(spec: KernelSpec, arrays: Sequence[Any], scalars: dict[str, Any],
               block: Sequence[int] | None = None, variant: int = 0) -> LaunchInfo:
    """The PyTorch op's checks, output shapes and grid (for ``block``, default the
    first candidate) for arrays (or abstract values) of these shapes and dtypes,
    through meta-tensor stand-ins."""
    tensors = iter(arrays)
    args = []
    for p in spec.arguments:
        if isinstance(p, ScalarParam):
            args.append(scalars[p.name])
            continue
        array = next(tensors)
        dtype = _torch_dtype(array.dtype)
        if dtype is None:
            raise ArgumentTypeError(
                f"{spec.name}(): argument {p.name!r} must be a {p.dtype.name} tensor, got {np.dtype(array.dtype).name}"
            )
        args.append(torch.empty(tuple(array.shape), dtype=dtype, device="meta"))
    try:
        info = launch_info(spec, args, block, variant)
    except ArgumentTypeError as exc:
        p = next((q for q in spec.arguments if f"argument {q.name!r} must be a" in str(exc)), None)
        hint = _x64_hint(p) if isinstance(p, TensorParam) else ""
        if hint:
            raise ArgumentTypeError(f"{exc}{hint}") from None
        raise
    for axis, blocks in enumerate(info.grid):
        if blocks > (2**31 - 1 if axis == 0 else 65535):  # as the C++ launcher checks
            raise ArgumentShapeError(
                f"{spec.name}(): the launch needs {blocks} blocks on axis {axis}, more than CUDA allows"
            )
    for p in spec.outputs:
        if p.dtype.storage_itemsize == 8 and not _x64():
            raise ArgumentTypeError(
                f"{spec.name}(): output {p.name!r} is {p.dtype.name}, which JAX makes only with 64-bit types "
                f"enabled: jax.config.update('jax_enable_x64', True)"
            )
    return info


# ---------------------------------------------------------------------------- running


@functools.lru_cache(maxsize=1)
def _cuda_devices() -> tuple[Any, ...]:
    """The GPUs JAX sees (none without a CUDA backend)."""
    try:
        return tuple(jax.devices("cuda"))
    except RuntimeError:
        return ()


def _cuda_archs() -> tuple[str, ...]:
    """The architectures of the GPUs JAX sees."""
    return tuple(sorted({str(d.compute_capability) for d in _cuda_devices() if getattr(d, "compute_capability", None)}))


def _torch_index(device: Any) -> int:
    """The CUDA ordinal PyTorch gives a JAX GPU (both number the visible devices)."""
    index = getattr(device, "local_hardware_id", None)
    return int(device.id if index is None else index)


def _to_torch(array: np.ndarray) -> torch.Tensor:
    array = np.array(array)  # a writable copy: XLA's buffers are read-only
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(jnp.bfloat16)
    return tensor.numpy()


#: A launch candidate: (block shape, Tune variant).


LaunchChoice = tuple[tuple[int, ...], int]


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity, as a jaxpr parameter
class _Launch:
    """One traced launch: what the ``pnex_launch`` primitive's lowerings need."""

    definition: KernelDefinition
    layout: xla.CallLayout
    info: LaunchInfo
    scalars: tuple[tuple[str, Any], ...]
    slots: tuple[int, ...]
    results: tuple[Any, ...]  #: one core.ShapedArray per result
    variant: int = 0  #: the Tune variant launched (KernelSpec.tune_variants)

    def __repr__(self) -> str:
        return f"{self.definition.spec.name}(grid={self.info.grid}, block={self.info.block})"


# One primitive, lowered per platform when JAX lowers the computation: on CUDA to the
# XLA FFI call of pnex's handler, everywhere else to a host callback running the CUDA
# simulator.  The lowered program holds exactly one of them and no `case` on the
# platform (which lax.platform_dependent stages out, and XLA then has to fold).
_launch_p = Primitive("pnex_launch")
_launch_p.multiple_results = True


@_launch_p.def_abstract_eval
def _launch_abstract(*operands: Any, launch: _Launch) -> tuple[Any, ...]:
    return launch.results


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _launch_jitted(launch: _Launch) -> Any:
    return jax.jit(functools.partial(_launch_p.bind, launch=launch))


@_launch_p.def_impl
def _launch_impl(*operands: Any, launch: _Launch) -> Any:
    """Outside any trace (``jax.disable_jit``): compile the one launch (a launch has
    no eager form: its lowering is the kernel)."""
    with jax.disable_jit(False):
        return _launch_jitted(launch)(*operands)


def _lower_cuda(ctx: Any, *operands: Any, launch: _Launch) -> Any:
    if launch.definition.options.check:  # checked launches: through the PyTorch op's launcher
        return mlir.lower_fun(functools.partial(_checked_on_gpu, launch), multiple_results=True)(ctx, *operands)
    if _through_python_now(ctx, launch):  # the XLA handler is not built yet (or cannot be)
        return mlir.lower_fun(functools.partial(_through_python, launch), multiple_results=True)(ctx, *operands)
    rule = jax.ffi.ffi_lowering(xla.TARGET, operand_output_aliases=dict(launch.layout.aliases))
    return rule(
        ctx,
        *operands,
        kernel=np.int64(_kernel_id(launch.definition, launch.variant)),
        grid=np.array(launch.info.grid, dtype=np.int64),
        block=np.array(launch.info.block, dtype=np.int64),
        scalars=np.array(launch.slots, dtype=np.int64),
        fill=np.array(launch.layout.fills, dtype=np.int64),
    )


def _simulated(launch: _Launch, *operands: Any) -> Any:
    def callback(*host: np.ndarray) -> tuple[np.ndarray, ...]:
        return _simulate(launch, *host)

    types = tuple(jax.ShapeDtypeStruct(r.shape, r.dtype) for r in launch.results)
    return jax.pure_callback(callback, types, *operands)


def _checked_on_gpu(launch: _Launch, *operands: Any) -> Any:
    """A kernel defined with ``check=True`` (``PNEX_CHECK=1``) in JAX on a GPU: a host
    callback runs its checked variant through pnex's PyTorch launcher on the same GPU,
    on copies of the arrays, so an access out of bounds raises ``KernelIndexError``
    (as JAX's runtime error) and is never made.  A debugging path: slow by design."""

    def callback(*host: np.ndarray) -> tuple[np.ndarray, ...]:
        index = torch.cuda.current_device()
        return _simulate(launch, *host, device=torch.device("cuda", index))

    types = tuple(jax.ShapeDtypeStruct(r.shape, r.dtype) for r in launch.results)
    return jax.pure_callback(callback, types, *operands)


def _through_python_now(ctx: Any, launch: _Launch) -> bool:
    """Whether a GPU trace launches through the Python launcher: the XLA handler is not
    ready here (:func:`pnex_magic.launch.xla.ready` starts its build in the background),
    GPUs run the program (an export for CUDA elsewhere names the handler only), and it
    is no export (which cannot hold a host callback)."""
    parameters = getattr(ctx.module_context, "lowering_parameters", None)
    if getattr(parameters, "for_export", False) or not _cuda_archs() or not _buffer_callbacks():
        return False
    return not xla.ready(launch.definition.options.verbose)


@functools.lru_cache(maxsize=1)
def _buffer_callbacks() -> bool:
    """Whether this JAX has ``jax.experimental.buffer_callback`` (0.7 and later); an older
    one builds the XLA handler in the foreground at the first GPU trace."""
    try:
        import jax.experimental.buffer_callback  # noqa: F401
    except ImportError:
        return False
    return True


def _through_python(launch: _Launch, *operands: Any) -> Any:
    """A GPU launch while the XLA handler builds: ``jax.experimental.buffer_callback``
    hands pnex's Python driver launcher XLA's buffers and stream, in place (the ``InMut``
    results aliased to their arguments, as for the handler), with no copy."""
    from jax.experimental.buffer_callback import ExecutionStage, buffer_callback

    def callback(ctx: Any, out: Any, *args: Any) -> None:
        if getattr(ctx, "stage", ExecutionStage.EXECUTE) == ExecutionStage.EXECUTE:
            _launch_on_buffers(launch, ctx.stream, args, out)

    types = tuple(jax.ShapeDtypeStruct(r.shape, r.dtype) for r in launch.results)
    return buffer_callback(callback, types, input_output_aliases=dict(launch.layout.aliases))(*operands)


def _launch_on_buffers(launch: _Launch, stream: int, args: Sequence[Any], out: Sequence[Any]) -> None:
    """Launch ``launch`` through the Python driver launcher on XLA's device buffers
    (zero-copy DLPack views) and stream: the operands ``args`` and the results ``out``
    (an ``InMut``'s result is its argument's buffer), the ``Out(init=...)`` that XLA did
    not fill filled first on the same stream."""
    definition, layout, info = launch.definition, launch.layout, launch.info
    spec = definition.spec
    _, index = (args[0] if args else out[0]).__dlpack_device__()
    device = torch.device("cuda", int(index))
    with torch.cuda.device(device), torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device)):
        env: dict[str, Any] = {name: torch.from_dlpack(b) for name, b in zip(layout.operands, args)}
        env.update((name, torch.from_dlpack(b)) for name, b in zip(layout.results, out))
        for p in spec.outputs:
            if p.init is not None and p.name not in layout.operands:
                env[p.name].fill_(p.init)
        env.update(launch.scalars)
        env.update(spec.tune_values(launch.variant))
        values = [env.get(p.name) for p in spec.params]
        launcher_for(device).launch(definition, values, info.grid, info.block, device, launch.variant)


def _lower_simulated(ctx: Any, *operands: Any, launch: _Launch) -> Any:
    return mlir.lower_fun(functools.partial(_simulated, launch), multiple_results=True)(ctx, *operands)


def _launch_batched(args: Sequence[Any], dims: Sequence[Any], *, launch: _Launch) -> tuple[Any, Any]:
    """vmap: one launch per batch element (a kernel knows nothing of a batch axis)."""
    batched = [d is not None for d in dims]
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]

    def one(xs: list[Any]) -> Any:
        given = iter(xs)
        return _launch_p.bind(*[next(given) if b else a for a, b in zip(moved, batched)], launch=launch)

    results = jax.lax.map(one, [a for a, b in zip(moved, batched) if b])
    return results, [0] * len(results)


mlir.register_lowering(_launch_p, _lower_simulated)
mlir.register_lowering(_launch_p, _lower_cuda, platform="cuda")
batching.primitive_batchers[_launch_p] = _launch_batched


def _simulate(launch: _Launch, *operands: np.ndarray, device: torch.device | None = None) -> tuple[np.ndarray, ...]:
    """The CPU path (a ``pure_callback``): the kernel in the CUDA simulator; with a CUDA
    ``device``, the checked path: pnex's PyTorch launcher there."""
    definition, layout, info = launch.definition, launch.layout, launch.info
    spec = definition.spec
    device = device or torch.device("cpu")
    env: dict[str, Any] = {name: _to_torch(a).to(device) for name, a in zip(layout.operands, operands)}
    env.update(launch.scalars)
    env.update(spec.tune_values(launch.variant))
    for p, shape in zip(spec.outputs, info.output_shapes):
        if p.name not in env:
            env[p.name] = (torch.empty(shape, dtype=p.dtype.torch, device=device) if p.init is None
                           else torch.full(shape, p.init, dtype=p.dtype.torch, device=device))
    values = [env.get(p.name) for p in spec.params]
    launcher_for(device).launch(definition, values, info.grid, info.block, device, launch.variant)
    return tuple(_to_numpy(env[name].cpu()) for name in layout.results)


def _kernel_id(definition: KernelDefinition, variant: int = 0) -> int:
    """The kernel's id in the XLA handler's registry, registered with its code for
    the GPUs JAX sees (none: an export for CUDA elsewhere, which names it only)."""
    archs = _cuda_archs()
    if not archs:
        return xla.kernel_id(definition, variant)
    if not definition.compiles:
        raise KernelCompileError(
            f"kernel {definition.spec.name!r} was not compiled ({definition.toolchain_error}), so it cannot run "
            f"on a GPU from JAX; install numba-cuda[cu12] or numba-cuda[cu13]"
        )
    return xla.register_kernel(definition, archs, verbose=definition.options.verbose, variant=variant)


# ---------------------------------------------------------------------------- block shapes

_WARNED: set[str] = set()


def _tuning_key(spec: KernelSpec, arrays: Sequence[Any], scalars: dict[str, Any]) -> tuple[int, ...]:
    tensors = iter(arrays)
    env = {p.name: scalars[p.name] if isinstance(p, ScalarParam) else
           torch.empty(tuple(next(tensors).shape), device="meta") for p in spec.arguments}
    return autotune.key_values(spec, env)


def _stored_block(definition: KernelDefinition, arrays: Sequence[Any], scalars: dict[str, Any],
                  device_index: int | None = None, *, warn: bool = True) -> LaunchChoice | None:
    """The block and ``Tune`` variant the PyTorch op's tuner chose for this call's key
    (in this process or on disk for this GPU model), or ``None``: then the first
    candidate launches (and, with ``warn``, a warning says so once per kernel)."""
    spec = definition.spec
    if not spec.autotuned:
        return None
    devices = _cuda_devices()
    if not devices:
        return None  # the simulator: the first candidate
    key = _tuning_key(spec, arrays, scalars)
    index = _torch_index(devices[0]) if device_index is None else device_index
    try:
        found = autotune.stored_choice(definition, device_index=index, layout="C", key=key)
    except Exception as exc:  # e.g. a PyTorch without CUDA: no GPU facts to find a choice by
        log.debug("pnex: no stored autotune choice for %r: %s", spec.name, exc)
        found = None
    if found is not None:
        return found.block, found.variant
    if warn and spec.name not in _WARNED:
        _WARNED.add(spec.name)
        log.warning(
            "pnex: kernel %r is autotuned, but no block was chosen yet for %s: this JAX trace launches the first "
            "candidate, %s. Call the JAX function once on concrete arrays on the GPU (or the PyTorch op on "
            "representative inputs) before jax.jit traces it to launch the tuned block",
            spec.name, autotune.key_text(spec, key, "C"), autotune.format_block(spec.threads_per_block),
        )
    return None


def _concrete_gpu_arrays(arrays: Sequence[Any]) -> Any:
    """The GPU the arrays live on, if they are all concrete JAX arrays on one GPU."""
    device = None
    for a in arrays:
        if isinstance(a, jax.core.Tracer) or not isinstance(a, jax.Array):
            return None
        found = a.devices()
        if len(found) != 1:
            return None
        (d,) = found
        if d.platform not in ("cuda", "gpu") or (device is not None and d != device):
            return None
        device = d
    return device


def _tune_eagerly(op: PnexOp, arrays: Sequence[Any], scalars: dict[str, Any]) -> LaunchChoice | None:
    """Before an eager call traces an autotuned kernel: let the PyTorch op choose the
    block for this key, on zero-copy DLPack views of the arrays (copies of the InMut
    ones: the op writes its InMut arguments, JAX arrays are immutable); returns the
    chosen block, or ``None`` where that cannot be done."""
    definition = op.definition
    spec = definition.spec
    device = _concrete_gpu_arrays(arrays)
    if device is None or not autotune.enabled() or not torch.cuda.is_available():
        return None
    index = _torch_index(device)
    found = _stored_block(definition, arrays, scalars, index, warn=False)
    if found is not None:
        return found
    try:
        views = iter([torch.from_dlpack(a) for a in arrays])
        args = []
        for p in spec.arguments:
            if isinstance(p, ScalarParam):
                args.append(scalars[p.name])
            else:
                view = next(views)
                args.append(view.clone() if p.role == "inmut" else view)
        with torch.cuda.device(index):
            op(*args)
            torch.cuda.synchronize(index)  # done reading the arrays before JAX may reuse them
    except Exception as exc:  # tuning is an optimisation: the trace then looks for a choice, or runs the first
        log.warning("pnex: could not autotune %r through the PyTorch op before tracing it in JAX: %s", spec.name, exc)
        return None
    found = autotune.stored_choice(definition, device_index=index, layout="C", key=_tuning_key(spec, arrays, scalars))
    return None if found is None else (found.block, found.variant)


def eager_choice(op: PnexOp, arrays: Sequence[Any], scalars: dict[str, Any]) -> LaunchChoice | None:
    """The launch candidate an eager call of an autotuned op on concrete GPU arrays
    runs: the PyTorch op's choice for its key, tuned first if there is none
    (:func:`_tune_eagerly`); ``None`` otherwise (a trace looks for a stored choice)."""
    spec = op.definition.spec
    if not spec.autotuned or _concrete_gpu_arrays(arrays) is None:
        return None
    check_call(spec, arrays, scalars)  # wrong arguments raise before anything runs
    return _tune_eagerly(op, arrays, scalars)


# ---------------------------------------------------------------------------- tracing


def run(definition: KernelDefinition, arrays: Sequence[Any], scalars: dict[str, Any], slots: Sequence[int],
        choice: LaunchChoice | None = None) -> tuple:
    """Trace one launch of ``definition``: every result (Out arrays, then InMut arrays).
    ``choice``: the block shape and ``Tune`` variant to launch (default: the autotuned
    choice stored for this call's key, else the first candidate)."""
    spec = definition.spec
    if choice is None:
        check_call(spec, arrays, scalars)  # the argument checks come first
        choice = _stored_block(definition, arrays, scalars)
    if choice is None and spec.variant_checks:  # tune_requires per call: the first variant the call keeps
        choice = spec.launch_candidates[spec.first_candidate(_tuning_key(spec, arrays, scalars))]
    block, variant = choice if choice is not None else (None, 0)
    info = check_call(spec, arrays, scalars, block, variant)
    layout = xla.call_layout(spec)
    env = dict(zip((p.name for p in spec.arguments if isinstance(p, TensorParam)), arrays))
    dtypes = {p.name: jnp.dtype(p.dtype.name) for p in spec.params if isinstance(p, TensorParam)}
    shapes = {name: tuple(a.shape) for name, a in env.items()}
    shapes.update((p.name, shape) for p, shape in zip(spec.outputs, info.output_shapes))
    results = tuple(core.ShapedArray(shapes[n], dtypes[n]) for n in layout.results)
    if not results:
        return ()
    if 0 in info.grid:  # nothing to launch: Outs are their init (or zeros), InMuts unchanged
        return tuple(
            env[n] if n in env else jnp.full(r.shape, spec.param(n).init or 0, dtype=r.dtype)
            for n, r in zip(layout.results, results)
        )
    for name in layout.operands:  # an Out(init=...) no memset pattern expresses: XLA fills it
        if name not in env:
            env[name] = jnp.full(shapes[name], spec.param(name).init, dtype=dtypes[name])
    launch = _Launch(definition, layout, info, tuple(scalars.items()), tuple(slots), results, variant)
    return tuple(_launch_p.bind(*(env[n] for n in layout.operands), launch=launch))
