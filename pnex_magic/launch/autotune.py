"""Autotuning an op's launch: time every candidate once per key, keep the fastest.

An op defined with ``threads_per_block="auto"`` or a list of candidates
(:mod:`pnex_magic.blocks`), or with ``Tune`` parameters (compile-time constants with
several choices, each compiled into its own variant of the kernel), picks its launch
candidate, a block shape and a ``Tune`` variant
(:attr:`~pnex_magic.spec.KernelSpec.launch_candidates`), per *key*: the values of its
``autotune_key`` expressions (default: every input size, bucketed to powers of
two) and the layout variant (all inputs contiguous, or not), on one device.
A GPU launcher asks :func:`choose` on the first call of each key (the C++
launcher keeps the answer in its own table, so later calls run no Python):

1. a choice already made in this process, or stored on disk for the same GPU
   model, kernel build (source, options, architecture, layout, toolchain),
   candidates and key, is reused (``%%pnex --force`` re-times);
2. otherwise, unless the stream is capturing a CUDA graph, the call comes from
   ``torch.compile``'d code or ``PNEX_AUTOTUNE=0`` (then the first candidate is
   used and a warning says so, once), every
   candidate that fits the kernel's limits (:func:`pnex_magic.hardware.block_problem`)
   runs once on copies of the ``InMut`` arguments (the caller's tensors are never
   written); a candidate whose results differ from the first candidate's (a kernel
   that depends on its block shape) or that fails to launch is skipped; the rest
   are timed with CUDA events (device time: the stream is kept busy while the
   calls are queued, so host overhead does not count) and the fastest is kept
   and stored on disk.

Calls that ``torch.compile`` traces run the op's fake implementation and never
reach this module; compiled code running the op (AOTAutograd's and Inductor's
runtime, ``mode="reduce-overhead"``'s warm-up and capture) never benchmarks.  To
tune a compiled model, call the op once eagerly on representative inputs: the
choices are kept in memory and on disk.  The results (:class:`TuneResult`) are
kept per definition for the report (:func:`result_for`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import math
import os
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .. import cache
from ..blocks import bucket
from ..errors import KernelLaunchError
from ..hardware import block_problem
from ..spec import KernelSpec, TensorParam
from . import checks, cooperative
from .hidden import hidden_arrays
from .kernel import Kernel

__all__ = [
    "CandidateResult",
    "TuneResult",
    "Runner",
    "stats",
    "enabled",
    "key_values",
    "key_text",
    "choose",
    "stored_choice",
    "result_for",
    "results",
    "format_block",
    "RECORD_KIND",
]

log = logging.getLogger(__name__)

#: The kind of the disk records (:func:`pnex_magic.cache.store_record`) holding choices.
RECORD_KIND = "autotune"


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    """One launch candidate (a block shape and the values of the ``Tune`` parameters):
    its device time per call, or why it was not timed."""

    block: tuple[int, ...]
    seconds: float | None = None
    skipped: str = ""
    tune: tuple[tuple[str, Any], ...] = ()  #: the Tune values, e.g. (("ITEMS", 4),)
    variant: int = 0  #: index into the spec's tune_variants

    def label(self) -> str:
        """``256`` or ``(32, 8)``, with the Tune values: ``256, ITEMS=4``."""
        return ", ".join([format_block(self.block), *(f"{n}={v!r}" for n, v in self.tune)])


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The choice of a block shape for one key, and how it was made."""

    kernel: str
    key: tuple[int, ...]
    key_text: str  #: e.g. "a.size(0)=1024 (powers of two), contiguous"
    candidates: tuple[CandidateResult, ...]
    choice: int  #: index into the spec's launch_candidates
    source: str  #: "benchmarked", "disk cache", or "first candidate: <why>"
    device: str = ""  #: the GPU model the times are from
    #: seconds the choice took (compiling the Tune variants and timing every candidate)
    seconds_total: float | None = None

    @property
    def block(self) -> tuple[int, ...]:
        return self.candidates[self.choice].block

    @property
    def variant(self) -> int:
        """The chosen ``Tune`` variant (index into the spec's tune_variants)."""
        return self.candidates[self.choice].variant

    @property
    def tune(self) -> tuple[tuple[str, Any], ...]:
        return self.candidates[self.choice].tune

    @property
    def timed(self) -> bool:
        return any(c.seconds is not None for c in self.candidates)

    @property
    def speedup(self) -> float | None:
        """The first candidate's time over the chosen one's (above 1: tuning helped)."""
        first, chosen = self.candidates[0].seconds, self.candidates[self.choice].seconds
        if first is None or chosen is None or chosen <= 0:
            return None
        return first / chosen

    def summary(self) -> str:
        block = self.candidates[self.choice].label()
        if not self.timed:
            return f"{block} ({self.source}) for {self.key_text}"
        gain = "" if self.speedup is None else f", {self.speedup:.2f}x the first candidate's speed"
        took = "" if self.seconds_total is None else f", tuned in {self.seconds_total:.2f} s"
        return f"{block} ({self.source}{gain}{took}) for {self.key_text}"

    def lines(self) -> list[str]:
        out = [f"autotune  : {self.summary()}"]
        if not self.timed:
            return out + [f"  candidates: {'; '.join(c.label() for c in self.candidates)}"]
        width = max(14, *(len(c.label()) + 2 for c in self.candidates))
        for i, c in enumerate(self.candidates):
            mark = "*" if i == self.choice else " "
            what = f"{c.seconds * 1e6:9.2f} µs" if c.seconds is not None else f"    skipped: {c.skipped}" \
                if c.skipped else "    not timed"
            out.append(f"  {mark} {c.label():<{width}}{what}")
        return out


def format_block(block: Sequence[int]) -> str:
    """``256`` or ``(32, 8)``."""
    return str(block[0]) if len(block) == 1 else "(" + ", ".join(map(str, block)) + ")"


@dataclasses.dataclass
class TuneStats:
    """Counters for tests and benchmarks."""

    benchmarks: int = 0  #: keys timed
    disk_hits: int = 0  #: keys answered from the disk cache
    fallbacks: int = 0  #: calls that used the first candidate without tuning (capture, disabled)

    def reset(self) -> None:
        self.benchmarks = self.disk_hits = self.fallbacks = 0


stats = TuneStats()


def enabled() -> bool:
    """Whether ops may benchmark (``PNEX_AUTOTUNE=0`` turns it off: first candidate,
    or a choice already on disk)."""
    return os.environ.get("PNEX_AUTOTUNE", "1") != "0"


def key_values(spec: KernelSpec, env: Mapping[str, Any]) -> tuple[int, ...]:
    """The autotune key of one call (``env``: the op's arguments by name), as the C++
    launcher computes it."""
    exprs, bucketed = spec.tuning_key()
    values = tuple(int(e.evaluate(env)) for e in exprs)
    return tuple(bucket(v) for v in values) if bucketed else values


def key_text(spec: KernelSpec, key: Sequence[int], layout: str) -> str:
    exprs, bucketed = spec.tuning_key()
    exprs = exprs[:len(exprs) - len(spec.variant_checks)]  # which variants the call keeps: said below
    parts = ", ".join(f"{e}={v}" for e, v in zip(exprs, key))
    if bucketed:
        parts = f"{parts} (sizes rounded up to powers of two)" if parts else "any sizes"
    text = f"{parts or 'one key'}, {'contiguous' if layout == 'C' else 'strided'} inputs"
    if spec.variant_checks:
        kept = sum(spec.eligible(tuple(key)))
        text += f", {kept} of {len(spec.tune_variants)} Tune combinations kept by tune_requires"
    return text


@dataclasses.dataclass
class Runner:
    """How the tuner runs candidates of one call: ``run(i)`` launches launch candidate
    ``i`` once on the benchmark copies and returns the tensors it wrote (outputs,
    ``InMut`` copies); ``reset()`` restores the copies from the caller's arguments;
    ``n_threads(variant)`` is the call's ``n_threads`` with that variant's ``Tune`` values."""

    run: Callable[[int], list[torch.Tensor]]
    reset: Callable[[], None]
    n_threads: Callable[[int], tuple[int, ...]]
    device: torch.device


_LOCK = threading.RLock()
_RESULTS: weakref.WeakKeyDictionary[Any, dict[tuple[int, str, tuple[int, ...]], TuneResult]] = (
    weakref.WeakKeyDictionary()
)
_WARNED: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[str, str]:
    """The GPU model's name and its architecture (``sm_90``)."""
    return torch.cuda.get_device_name(index), "sm_%d%d" % torch.cuda.get_device_capability(index)


# Frames of code that runs torch.compile'd graphs (AOTAutograd's runtime wrappers,
# Inductor's runtime and the code it writes, torchinductor_<user>/...).
_COMPILED_CODE = (f"torch{os.sep}_functorch{os.sep}_aot_autograd", f"torch{os.sep}_inductor", "torchinductor_")


def _in_compiled_code() -> bool:
    """Whether this call comes from a ``torch.compile``'d graph (read from the Python stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _COMPILED_CODE):
            return True
        frame = frame.f_back
    return False


def _slot(definition: Kernel, gpu: str, arch: str, layout: str, key: tuple[int, ...]) -> str:
    spec = definition.spec
    # A kernel defined here names its build (source, options, architecture, layout,
    # toolchain); one loaded from an artifact is named by the code it launches.
    cache_key = getattr(definition, "cache_key", None)
    if cache_key is not None:
        build = cache_key(arch, layout)
    else:
        image, entry = definition.kernel_image(arch, layout)
        build = f"{hashlib.sha256(image).hexdigest()}|{entry}|{spec.describe()}"
    candidates = spec.block_candidates if not spec.tune_params else spec.launch_candidates
    text = f"{gpu}|{build}|{candidates}|{spec.tuning_key()[1]}|{key}"
    if spec.tune_rules:  # (the candidates number the combinations kept: other rules, other candidates)
        text += f"|{spec.tune_variants}"
    return hashlib.sha256(text.encode()).hexdigest()


def _writes_disk(definition: Kernel) -> bool:
    """Whether ``definition``'s choices are stored on disk (not where its options turn
    the cache off; a loaded artifact's options do not)."""
    return getattr(definition.options, "use_cache", True)


def _reads_disk(definition: Kernel) -> bool:
    """Whether a stored choice may serve ``definition`` (not under ``--force`` either)."""
    return _writes_disk(definition) and not getattr(definition.options, "force", False)


def _remember(definition: Kernel, where: tuple[int, str, tuple[int, ...]], result: TuneResult) -> TuneResult:
    _RESULTS.setdefault(definition, {})[where] = result
    return result


def choose(
    definition: Kernel,
    *,
    device_index: int,
    layout: str,
    key: tuple[int, ...],
    capturing: bool,
    runner: Callable[[], Runner],
) -> tuple[int, bool]:
    """The index of the candidate to launch for this key, and whether it is final (a
    launcher may keep it; a choice made under capture is not)."""
    spec = definition.spec
    where = (device_index, layout, key)
    found = _RESULTS.get(definition, {}).get(where)
    if found is not None:
        return found.choice, True
    if checks.forced(definition):  # a one-off checked run (the %%pnex magic's first): tune the fast code later
        return spec.first_candidate(key), False
    with _LOCK:
        found = _RESULTS.get(definition, {}).get(where)
        if found is not None:
            return found.choice, True
        gpu, arch = _device_facts(device_index)
        slot = _slot(definition, gpu, arch, layout, key)
        text = key_text(spec, key, layout)
        stored = cache.load_record(RECORD_KIND, slot) if _reads_disk(definition) else None
        result = _from_record(spec, stored, key, text) if stored else None
        if result is not None:
            stats.disk_hits += 1
            return _remember(definition, where, result).choice, True
        why = (
            "a CUDA graph is being captured" if capturing
            else "PNEX_AUTOTUNE=0" if not enabled()
            else "it runs in torch.compile'd code" if _in_compiled_code()
            else ""
        )
        if why:
            _warn_once(spec, why, text)
            stats.fallbacks += 1
            if capturing:  # not kept: a later eager call of this key may tune
                return spec.first_candidate(key), False
            return _remember(definition, where, _untimed(spec, key, text, f"first candidate: {why}", gpu)).choice, True
        result = _benchmark(definition, runner(), key, text, gpu, arch, layout)
        stats.benchmarks += 1
        if _writes_disk(definition):
            cache.store_record(RECORD_KIND, slot, {
                "kernel": f"{spec.module}.{spec.qualname}",
                "op_name": definition.op_name,
                "gpu": gpu,
                "arch": arch,
                "layout": layout,
                "key_values": list(key),
                "key_text": text,
                "candidates": [dataclasses.asdict(c) for c in result.candidates],
                "choice": list(result.block),
                "choice_tune": [v for _, v in result.tune],
                "seconds_total": result.seconds_total,
            })
        return _remember(definition, where, result).choice, True


def stored_choice(definition: Kernel, *, device_index: int, layout: str, key: tuple[int, ...]) -> TuneResult | None:
    """The choice already made for this key: in this process, or on disk for the same
    GPU model and kernel build; ``None`` if it was never tuned.  Times nothing: what
    launchers that cannot benchmark (a JAX trace, whose launch is fixed when traced)
    ask before they fall back to the first candidate."""
    where = (device_index, layout, key)
    found = _RESULTS.get(definition, {}).get(where)
    if found is not None:
        return found
    with _LOCK:
        found = _RESULTS.get(definition, {}).get(where)
        if found is not None:
            return found
        if not _reads_disk(definition):  # %%pnex --force: choices are made again; use_cache=False
            return None
        gpu, arch = _device_facts(device_index)
        stored = cache.load_record(RECORD_KIND, _slot(definition, gpu, arch, layout, key))
        result = _from_record(definition.spec, stored, key, key_text(definition.spec, key, layout)) if stored else None
        if result is None:
            return None
        stats.disk_hits += 1
        return _remember(definition, where, result)


def _warn_once(spec: KernelSpec, why: str, text: str) -> None:
    if (spec.name, why) in _WARNED:
        return
    _WARNED.add((spec.name, why))
    advice = "" if why == "PNEX_AUTOTUNE=0" else (
        "; call it once eagerly on representative inputs first to tune it (choices are kept on disk)"
    )
    log.warning(
        "pnex: kernel %r is not autotuned while %s: it launches with its first candidate, %s, for keys "
        "not tuned yet (first: %s)%s", spec.name, why, format_block(spec.threads_per_block), text, advice,
    )


def _tune_of(spec: KernelSpec, variant: int) -> tuple[tuple[str, Any], ...]:
    return tuple(spec.tune_values(variant).items())


def _rows(spec: KernelSpec) -> list[CandidateResult]:
    """One untimed row per launch candidate."""
    return [CandidateResult(b, tune=_tune_of(spec, v), variant=v) for b, v in spec.launch_candidates]


def _untimed(spec: KernelSpec, key: tuple[int, ...], text: str, source: str, device: str = "") -> TuneResult:
    return TuneResult(spec.name, key, text, tuple(_rows(spec)), spec.first_candidate(key), source, device)


def _from_record(spec: KernelSpec, data: dict[str, Any], key: tuple[int, ...], text: str) -> TuneResult | None:
    try:
        wanted = (tuple(data["choice"]), tuple(data.get("choice_tune", ())))
        labels = [(tuple(r.block), tuple(v for _, v in r.tune)) for r in _rows(spec)]
        choice = labels.index(wanted)
        times = {(tuple(c["block"]), tuple(v for _, v in c.get("tune", ()))): c for c in data.get("candidates", ())}
    except (KeyError, TypeError, ValueError):
        return None
    rows = tuple(
        dataclasses.replace(r, seconds=times.get(label, {}).get("seconds"), skipped=times.get(label, {}).get("skipped", ""))
        for r, label in zip(_rows(spec), labels)
    )
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(data.get("created", 0)))
    return TuneResult(spec.name, key, text, rows, choice, f"disk cache, timed {when}", str(data.get("gpu", "")),
                      data.get("seconds_total"))


def results(definition: Kernel) -> list[TuneResult]:
    """Every choice made for ``definition`` in this process (any device, layout, key)."""
    return list(_RESULTS.get(definition, {}).values())


def result_for(definition: Kernel, args: Sequence[Any]) -> TuneResult | None:
    """How the block for a call on ``args`` (the op's arguments) was chosen, if the op
    is autotuned: the GPU tuner's result for that key, or, for CPU tensors, the first
    candidate (the CUDA simulator does not autotune)."""
    spec = definition.spec
    if not spec.autotuned:
        return None
    env = {p.name: v for p, v in zip(spec.arguments, args)}
    tensors = [v for p, v in zip(spec.arguments, args) if isinstance(p, TensorParam)]
    layout = "C" if all(t.is_contiguous() for t in tensors) else "A"
    key = key_values(spec, env)
    text = key_text(spec, key, layout)
    device = tensors[0].device if tensors else torch.device("cpu")
    if device.type != "cuda":
        return _untimed(spec, key, text, "first candidate: the CUDA simulator does not autotune")
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _RESULTS.get(definition, {}).get((index, layout, key))


# --------------------------------------------------------------------------- benchmarking

# Relative and absolute tolerances when comparing a candidate's results with the first
# candidate's (float atomics may add in another order).
_TOLERANCES = {torch.float16: (1e-2, 1e-3), torch.bfloat16: (5e-2, 1e-2), torch.float32: (1e-4, 1e-6),
               torch.float64: (1e-9, 1e-12)}


def _differs(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> str:
    for x, y in zip(a, b, strict=True):
        if x.dtype in _TOLERANCES:
            rtol, atol = _TOLERANCES[x.dtype]
            if not torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
                diff = (x.double() - y.double()).abs().nan_to_num(nan=math.inf).max().item()
                return f"max abs difference {diff:.3g}"
        elif not torch.equal(x, y):
            return "results not equal"
    return ""


def _sticky(device: torch.device) -> BaseException | None:
    """The error a failed launch left on the device, if it poisoned the context."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
    except Exception as exc:  # an illegal address and the like: nothing more can run
        return exc
    return None


def _device_seconds(call: Callable[[], Any], device: torch.device, repeat: int = 5) -> float:
    """Median device seconds per call.  The stream first runs a spin kernel long
    enough for the host to queue every call of a run, so the events time the kernels
    back to back, not the host's launch overhead."""
    sleep = getattr(torch.cuda, "_sleep", None)

    def run(loops: int, host_seconds: float) -> float:
        if sleep is not None and host_seconds > 0:
            sleep(int(min(0.05, 1.5 * loops * host_seconds) * 2e9))  # cycles, at most ~2 GHz
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(loops):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / loops

    call()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(3):
        call()
    host = (time.perf_counter() - t0) / 3
    probe = run(3, host)
    loops = max(1, min(1000, math.ceil(2e-4 / max(probe, 1e-7))))
    return statistics.median(run(loops, host) for _ in range(repeat))


def _resources(definition: Kernel, arch: str, layout: str, variant: int = 0) -> Any:
    """ptxas's figures for the code launched (``None`` where the kernel has none);
    compiles a ``Tune`` variant the first time it is asked for."""
    compiled = getattr(definition, "compiled", None)
    return compiled(arch, layout=layout, variant=variant).resources if compiled is not None else None


@contextlib.contextmanager
def _hidden_arrays_kept(definition: Kernel) -> Any:
    """The device arrays the kernel reads as globals (hidden arguments), which it may
    write, as they were before tuning: yields a function that restores them (before each
    candidate's checked run), and restores them when tuning ends, so that the caller's
    launch sees what it would have seen without tuning."""
    kept = [(t, t.clone()) for t in (h.tensor() for h in hidden_arrays(definition))]

    def restore() -> None:
        for tensor, copy in kept:
            tensor.copy_(copy)

    try:
        yield restore
    finally:
        restore()


def _benchmark(
    definition: Kernel, runner: Runner, key: tuple[int, ...], text: str, gpu: str, arch: str, layout: str,
    seconds: Callable[[Callable[[], Any], torch.device], float] | None = None,
) -> TuneResult:
    """Check and time every candidate (``seconds(call, device)`` times one; default
    :func:`_device_seconds`)."""
    seconds = seconds or _device_seconds
    spec = definition.spec
    started = time.perf_counter()
    rows: list[CandidateResult] = []
    reference: list[torch.Tensor] | None = None
    on_device = torch.cuda.device(runner.device) if runner.device.type == "cuda" else contextlib.nullcontext()
    sms = 0  # for a cooperative kernel on a GPU: its SMs, to skip grids that cannot be resident
    if getattr(definition, "cooperative", False) and runner.device.type == "cuda":
        sms = torch.cuda.get_device_properties(runner.device).multi_processor_count
    with torch.no_grad(), on_device, _hidden_arrays_kept(definition) as restore_hidden:
        eligible = spec.eligible(key)
        for i, ((block, variant), row) in enumerate(zip(spec.launch_candidates, _rows(spec))):
            if not eligible[variant]:  # jit(tune_requires=...) per call: not for this call's sizes
                rows.append(dataclasses.replace(row, skipped="its Tune values break tune_requires for this call: "
                                                + "; ".join(f"`{r.text}`" for r in spec.call_tune_rules)))
                continue
            try:
                resources = _resources(definition, arch, layout, variant)
                n_threads = runner.n_threads(variant)
            except Exception as exc:  # a Tune variant that does not compile, or an n_threads that fails
                rows.append(dataclasses.replace(row, skipped=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
                continue
            dynamic_shared = spec.shared_of(variant)  # each Tune variant its own bytes
            problem = block_problem(
                arch, resources.registers if resources else None, resources.shared_bytes if resources else None,
                block, n_threads, dynamic_shared,
            )
            if not problem and any(n <= 0 for n in n_threads):
                problem = f"n_threads = {n_threads} with {row.label()}: nothing to launch"
            if not problem and sms:  # a grid sync: every block resident at once
                problem = cooperative.candidate_problem(
                    spec.name, arch, resources.registers if resources else None,
                    resources.shared_bytes if resources else None, block, n_threads, sms, dynamic_shared,
                )
            if problem:
                rows.append(dataclasses.replace(row, skipped=problem))
                continue
            runner.reset()
            restore_hidden()
            try:
                written = runner.run(i)
                if runner.device.type == "cuda":
                    torch.cuda.synchronize(runner.device)  # a fault shows here, named by its block
            except Exception as exc:
                sticky = _sticky(runner.device)
                if sticky is not None:
                    raise KernelLaunchError(
                        f"kernel {spec.name!r} faulted while autotuning ran it with block {row.label()}: {sticky}. "
                        f"A kernel that assumes a block shape must pin threads_per_block"
                    ) from None
                rows.append(dataclasses.replace(row, skipped=f"launch failed: {str(exc).splitlines()[0][:160]}"))
                continue
            if reference is None:
                reference = [t.clone() for t in written]
            else:
                differs = _differs(written, reference)
                if differs:
                    rows.append(dataclasses.replace(row, skipped=(
                        f"its results differ from the first timed candidate's ({differs}): does the kernel assume "
                        f"a block shape?")))
                    continue
            rows.append(dataclasses.replace(row, seconds=seconds(lambda i=i: runner.run(i), runner.device)))
    took = time.perf_counter() - started
    timed = [i for i, c in enumerate(rows) if c.seconds is not None]
    if not timed:
        return TuneResult(spec.name, key, text, tuple(rows), spec.first_candidate(key),
                          "first candidate: no candidate could be timed", gpu, took)
    best = min(timed, key=lambda i: rows[i].seconds)
    log.info("pnex: kernel %r autotuned for %s: %s", spec.name, text, rows[best].label())
    return TuneResult(spec.name, key, text, tuple(rows), best, "benchmarked", gpu, took)
