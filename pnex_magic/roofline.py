"""The compute roofline: a kernel's floating-point work against the GPU's compute peak.

The FLOP count of one call comes from the kernel's author, as an expression over the
kernel's parameters (``jit(flops="2 * a.size(0) * b.size(1) * a.size(1)")``,
``%%pnex --flops "2*M*N*K"``), in the integer language of ``n_threads``
(:mod:`pnex_magic.expressions`: sizes, integer scalars, ``Tune`` values, ``+ - * //
% min max``), parsed once when the kernel is defined (:func:`parse_flops`).  Without
one, it is inferred where it can be (:func:`ptx_flops`): a kernel without loops or
calls runs each floating-point instruction of its PTX at most once per thread, so the
count is those instructions (an FMA counts 2, a two-lane ``f16x2`` instruction twice)
× the threads ``n_threads`` asks for.  That is exact for straight-line code and an
upper bound where branches skip some; the report says which way the count was made.

:func:`assess` compares one timed call with the peak of what its arithmetic runs on
(:func:`~pnex_magic.hardware.peak_flops`): the tensor cores where its SASS holds
tensor-core instructions (HMMA from ``mma.sync``, HGMMA from Hopper's ``wgmma``;
:func:`tensor_cores`), else the FP32 or FP64 CUDA cores.  Its arithmetic intensity
(FLOP per byte moved) against the ridge point (compute peak / bandwidth ceiling) says
which roof binds: above the ridge a kernel is compute-bound, and the report's "why"
(:attr:`Compute.reason`) speaks of the compute ceiling and of the tensor cores
instead of memory.  Without a timing (CPU tensors run in the simulator) the report
gives the count alone, never a rate.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .efficiency import FAR, Reason
from .errors import PnexError, ShapeExpressionError
from .expressions import Expr, NameInfo, parse_expression
from .hardware import DeviceInfo, PeakFlops, peak_flops
from .spec import KernelSpec, ScalarParam, TensorParam, TuneParam
from .timing import format_time

__all__ = [
    "FlopCount", "Compute", "TensorCores", "parse_flops", "ptx_flops", "tensor_cores", "instruction_mix",
    "count_flops", "assess", "format_flops", "tflops", "with_compute",
]


# --------------------------------------------------------------------------- the count


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """The FLOP count of a kernel's call: its author's expression (``expr``), parsed."""

    text: str  #: as written
    expr: Expr

    def evaluate(self, env: Mapping[str, Any]) -> int:
        try:
            return int(self.expr.evaluate(env))
        except PnexError as exc:  # a division by zero, say: name the option
            raise type(exc)(f"flops={self.text!r}: {exc}") from None


def _names(spec: KernelSpec) -> dict[str, NameInfo]:
    names: dict[str, NameInfo] = {}
    for p in spec.params:
        if isinstance(p, TensorParam):
            names[p.name] = NameInfo("tensor", ndim=p.ndim)
        elif isinstance(p, ScalarParam):
            names[p.name] = NameInfo("scalar", integral=not p.dtype.is_floating_point and p.dtype.name != "bool")
        elif isinstance(p, TuneParam):
            names[p.name] = NameInfo("scalar", integral=p.kind == "int")
    return names


def parse_flops(spec: KernelSpec, text: str | int | None) -> FlopCount | None:
    """``flops=`` of ``jit()`` (``--flops`` of ``%%pnex``) for ``spec``'s kernel:
    ``None`` stays ``None``; anything else must be an int or an expression over the
    parameters, else :class:`~pnex_magic.ShapeExpressionError` says what is wrong."""
    if text is None:
        return None
    if isinstance(text, str) and not text.strip():
        raise ShapeExpressionError(f"kernel {spec.name!r}, flops: empty expression; give e.g. '2 * a.numel()'")
    expr = parse_expression(text, _names(spec), where=f"kernel {spec.name!r}, flops")
    return FlopCount(str(text).strip(), expr)


# PTX floating-point arithmetic: the operation, its modifiers, and the type last.
_PTX_FP = re.compile(
    r"^\s*(?:@!?%\w+\s+)?(add|sub|mul|fma|mad|div|sqrt|rsqrt|rcp|ex2|lg2|sin|cos|tanh)((?:\.\w+)*?)"
    r"\.(f16x2|bf16x2|f16|bf16|f32|f64)\s", re.MULTILINE)
_PTX_LABEL = re.compile(r"^\s*(\$?\w+):", re.MULTILINE)
_PTX_BRANCH = re.compile(r"^\s*(?:@!?%\w+\s+)?bra(?:\.uni)?\s+(\$?\w+)\s*;", re.MULTILINE)
_PTX_CALL = re.compile(r"^\s*(?:@!?%\w+\s+)?call(?:\.uni)?\b", re.MULTILINE)


def _entry_body(ptx: str, entry: str) -> str | None:
    start = ptx.find(f".entry {entry}") if entry else ptx.find(".entry ")
    if start < 0:
        return None
    end = ptx.find("\n}", start)
    return ptx[start:end if end >= 0 else len(ptx)]


def ptx_flops(ptx: str, entry: str = "") -> tuple[int | None, str, str]:
    """Floating-point operations one thread of the kernel ``entry`` runs, counted from
    its PTX: ``(count, kind, why_not)``; ``kind`` is ``"fp64"`` where any is double,
    else ``"fp32"``; ``count`` is ``None`` (``why_not`` says why) for a kernel with a
    loop (a backward branch) or a call, whose instructions run an unknown number of
    times."""
    body = _entry_body(ptx, entry)
    if body is None:
        return None, "fp32", "no kernel entry in the PTX"
    labels = {m.group(1): m.start() for m in _PTX_LABEL.finditer(body)}
    for m in _PTX_BRANCH.finditer(body):
        target = labels.get(m.group(1))
        if target is not None and target < m.start():
            return None, "fp32", "the kernel has a loop, whose trip count the PTX does not give"
    if _PTX_CALL.search(body):
        return None, "fp32", "the kernel calls a function the count cannot see into"
    count, double = 0, False
    for m in _PTX_FP.finditer(body):
        op, dtype = m.group(1), m.group(3)
        count += (2 if op in ("fma", "mad") else 1) * (2 if dtype.endswith("x2") else 1)
        double = double or dtype == "f64"
    return count, "fp64" if double else "fp32", ""


def count_flops(
    spec: KernelSpec, flops: FlopCount | None, env: Mapping[str, Any], n_threads: Sequence[int],
    ptx: str = "", entry: str = "",
) -> tuple[int | None, str, bool, str]:
    """One call's FLOP count: ``(flops, how, inferred, kind)``.  ``env`` holds the call's
    arguments, outputs (shapes suffice) and ``Tune`` values; ``flops`` is the author's
    count, else it is inferred from ``ptx`` (:func:`ptx_flops`).  ``how`` says where
    the count came from, or why there is none; ``kind`` is the inferred arithmetic's
    (``"fp32"``/``"fp64"``), ``""`` for a given count."""
    if flops is not None:
        value = flops.evaluate(env)
        return value, f"{flops.text}, given with flops=", False, ""
    if not ptx:
        return None, "no FLOP count: give one with flops= (--flops), e.g. '2 * a.numel()'", False, ""
    per_thread, kind, why_not = ptx_flops(ptx, entry)
    if per_thread is None:
        return None, f"no FLOP count: {why_not}; give one with flops= (--flops)", False, kind
    threads = math.prod(int(n) for n in n_threads)
    if per_thread == 0:
        return 0, "no floating-point instruction in the kernel's PTX", True, kind
    value = per_thread * threads
    return value, (f"inferred from the PTX: {per_thread} floating-point operation{'s' if per_thread != 1 else ''} "
                   f"per thread × {threads:,} threads (an FMA counts 2; an upper bound where branches skip some); "
                   f"flops= (--flops) sets it"), True, kind


def _figure(x: float) -> str:
    """Three figures, whole numbers from 100 up: ``23.4``, ``1,370``."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def tflops(rate: float) -> str:
    """``27.5 TFLOP/s``, ``1,070 TFLOP/s``: three figures, whole numbers from 100 up."""
    return f"{_figure(rate / 1e12)} TFLOP/s"


def format_flops(n: float) -> str:
    """``2.15 GFLOP``."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}FLOP"
    return f"{n:.0f} FLOP"


# --------------------------------------------------------------------------- what the arithmetic runs on


@dataclasses.dataclass(frozen=True)
class TensorCores:
    """The tensor-core instructions a kernel's code holds."""

    instruction: str  #: "HGMMA (wgmma)", "HMMA (mma.sync)", "DMMA", or the PTX's "mma.sync", "wgmma"
    kind: str  #: a tensor-core key of :data:`~pnex_magic.hardware.PEAK_KINDS`
    count: int  #: instructions in the listing
    precision: str  #: "BF16", "FP16", "TF32", "FP64"


_SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_x]+)*)")


def instruction_mix(sass: str) -> dict[str, int]:
    """How many times each opcode appears in a SASS listing (cuobjdump's or nvdisasm's)."""
    mix: dict[str, int] = {}
    for m in _SASS_OPCODE.finditer(sass or ""):
        mix[m.group(1)] = mix.get(m.group(1), 0) + 1
    return mix


def _precision(modifiers: str) -> tuple[str, str]:
    """The inputs' precision of a tensor-core instruction from its modifiers (SASS's
    ``.F32.BF16``, PTX's ``.f32.bf16.bf16.f32``); SASS writes none for FP16 inputs."""
    text = modifiers.upper()
    for word, precision, kind in (("TF32", "TF32", "tf32-tc"), ("BF16", "BF16", "fp16-tc"), ("F16", "FP16", "fp16-tc"),
                                  ("F64", "FP64", "fp64-tc")):
        if word in text:
            return precision, kind
    return "FP16", "fp16-tc"


def tensor_cores(sass: str = "", ptx: str = "") -> TensorCores | None:
    """The tensor-core instructions in ``sass`` (HGMMA, HMMA, DMMA) or, without a listing,
    in ``ptx`` (``wgmma.mma_async``, ``mma.sync``, ``wmma.mma``); ``None`` without any."""
    if sass:
        found: dict[str, list[str]] = {}
        for m in _SASS_OPCODE.finditer(sass):
            if m.group(1) in ("HGMMA", "HMMA", "DMMA"):
                found.setdefault(m.group(1), []).append(m.group(2))
        for opcode, label in (("HGMMA", "HGMMA (wgmma)"), ("HMMA", "HMMA (mma.sync)"), ("DMMA", "DMMA")):
            if opcode in found:
                modifiers = found[opcode][0] + (".F64" if opcode == "DMMA" else "")
                precision, kind = _precision(modifiers)
                return TensorCores(label, kind, len(found[opcode]), precision)
        return None
    for pattern, label in ((r"wgmma\.mma_async[\w.]*", "wgmma"), (r"\bmma\.sync[\w.]*", "mma.sync"),
                           (r"wmma\.mma[\w.]*", "wmma")):
        hits = re.findall(pattern, ptx or "")
        if hits:
            precision, kind = _precision(hits[0])
            return TensorCores(label, kind, len(hits), precision)
    return None


# --------------------------------------------------------------------------- the assessment


@dataclasses.dataclass(frozen=True)
class Compute:
    """One call's floating-point work, and, when timed, its rate against the compute peak."""

    flops: int | None  #: per call (``None``: unknown, :attr:`how` says why)
    how: str  #: where the count came from
    inferred: bool = False
    seconds: float | None = None  #: the op's median time (``None``: not timed)
    bytes_moved: int | None = None
    bandwidth: float | None = None  #: the memory ceiling, bytes per second (the copy, else the DRAM peak)
    peak: PeakFlops | None = None
    tensor: TensorCores | None = None
    mix: Mapping[str, int] = dataclasses.field(default_factory=dict, compare=False)  #: SASS opcode counts
    low_precision: bool = False  #: fp16/bf16 tensors among the kernel's
    arch: str = ""
    device: str = ""
    fp16_peak: PeakFlops | None = None  #: the FP16/BF16 tensor-core peak, for the advice on CUDA-core kernels

    @property
    def rate(self) -> float | None:
        """FLOP per second of the timed call."""
        if self.flops is None or not self.seconds:
            return None
        return self.flops / self.seconds

    @property
    def share(self) -> float | None:
        """The rate as a share of the compute peak."""
        rate = self.rate
        if rate is None or self.peak is None or not self.peak.flops:
            return None
        return rate / self.peak.flops

    @property
    def intensity(self) -> float | None:
        """FLOP per byte moved (every argument and output byte counted once)."""
        if self.flops is None or not self.bytes_moved:
            return None
        return self.flops / self.bytes_moved

    @property
    def ridge(self) -> float | None:
        """FLOP per byte where the compute peak and the bandwidth ceiling meet."""
        if self.peak is None or not self.peak.flops or not self.bandwidth:
            return None
        return self.peak.flops / self.bandwidth

    @property
    def bound(self) -> str | None:
        """``"compute"`` above the ridge point, ``"memory"`` below it, ``None`` where unknown."""
        intensity, ridge = self.intensity, self.ridge
        if intensity is None or ridge is None or not self.flops:
            return None
        return "compute" if intensity >= ridge else "memory"

    @property
    def roofline_text(self) -> str:
        """``1,370 FLOP per byte against a ridge point of 23.4 (...): compute-bound``."""
        if self.intensity is None or self.ridge is None:
            return "unknown"
        return (f"{_figure(self.intensity)} FLOP per byte against a ridge point of {_figure(self.ridge)} (compute "
                f"peak / bandwidth ceiling): {self.bound}-bound")

    def _rate_text(self) -> str:
        rate = self.rate
        return "n/a" if rate is None else tflops(rate)

    def describe(self) -> str:
        """``312 TFLOP/s = 29% of the FP16/BF16 tensor-core peak (1070 TFLOP/s)``."""
        text = self._rate_text()
        if self.share is not None:
            text += f" = {self.share:.0%} of the {self.peak.label} peak ({tflops(self.peak.flops)})"
        elif self.peak is not None and self.rate is not None:
            text += f" ({self.peak.label} peak: {self.peak.source})"
        return text

    def lines(self) -> list[str]:
        if self.flops is None:
            return [f"flops     : {self.how}"]
        out = [f"flops     : {format_flops(self.flops)} per call = {self.flops:,}: {self.how}"]
        if self.rate is None:
            out.append("compute   : not timed: FLOP/s needs a timed call on the GPU")
            if self.tensor is not None:
                out.append(f"tensor    : the code uses the tensor cores: {self.tensor.count} {self.tensor.instruction} "
                           f"({self.tensor.precision})")
            return out
        out.append(f"compute   : {self.describe()}")
        if self.peak is not None and self.peak.flops:
            out.append(f"peak      : {self.peak.source}")
        if self.intensity is not None and self.ridge is not None:
            out.append(f"roofline  : {self.roofline_text}")
        if self.tensor is not None:
            out.append(f"tensor    : uses the tensor cores: {self.tensor.count} {self.tensor.instruction} "
                       f"({self.tensor.precision})")
        return out

    def _local_memory(self) -> tuple[str, str] | None:
        """What the SASS says of local memory (``LDL``/``STL``), and what to change, or
        ``None`` where it has none: a compute-bound kernel's values (a fragment, an
        accumulator tile) should live in registers."""
        loads, stores = self.mix.get("LDL", 0), self.mix.get("STL", 0)
        if not loads and not stores:
            return None
        return (f"its SASS moves values through local memory ({loads} LDL, {stores} STL): a local array indexed "
                f"by a value known only at run time, or register spills",
                "keep the values in registers: loop over a cuda.local.array with range(N), N a compile-time "
                "constant (a literal, a closure constant or a Tune expression) and a small body, so that the loop "
                "unrolls and every index is a constant; not literal_unroll over integers, which keeps them in "
                "registers behind a chain of compares (docs: performance, \"Loops over a fragment\")")

    @property
    def reason(self) -> Reason | None:
        """Why a compute-bound call is where it is, speaking of the tensor cores where they
        apply; ``None`` for a call that is not compute-bound (or not timed)."""
        if self.bound != "compute" or self.share is None:
            return None
        share, peak = self.share, self.peak
        head = (f"compute-bound: {format_flops(self.flops)} in {format_time(self.seconds)} is {self._rate_text()}, "
                f"{share:.0%} of the {peak.label} peak; its {_figure(self.intensity)} FLOP per byte are above the "
                f"ridge ({_figure(self.ridge)}), so the compute peak, not memory, is its ceiling")
        local = self._local_memory()
        if local is not None and share < FAR:
            return Reason("compute", f"{head}; {local[0]}", local[1])
        tc = self.tensor
        if tc is not None:
            finding = f"{head}; it uses the tensor cores ({tc.count} {tc.instruction}, {tc.precision})"
            if tc.instruction.startswith("HMMA") and self.arch in ("sm_90", "sm_90a"):
                return Reason("compute", finding,
                              "on Hopper mma.sync (HMMA) reaches only part of the tensor-core peak: the full "
                              "rate needs "
                              "wgmma (HGMMA); otherwise keep the tensor cores fed: more tiles in flight per SM, "
                              "cp.async copies overlapped with the products (pnex.Tune over tile shapes and stages)")
            if share >= FAR:
                return Reason("compute", finding + ": at or near the ceiling", "little is left to gain in this kernel")
            return Reason("compute", finding,
                          "keep the tensor cores fed: more tiles in flight per SM, cp.async copies overlapped with "
                          "the products, swizzled shared tiles for conflict-free ldmatrix (pnex.Tune over tile shapes "
                          "and pipeline stages)")
        fma = sum(self.mix.get(op, 0) for op in ("FFMA", "HFMA2", "DFMA", "FADD", "FMUL", "HADD2", "HMUL2"))
        on = f"on the CUDA cores ({fma} FMA/ADD/MUL instructions, no tensor-core instruction in the SASS)" if self.mix \
            else "on the CUDA cores"
        finding = f"{head}, {on}"
        if self.low_precision and self.fp16_peak is not None and self.fp16_peak.flops and peak.flops:
            gain = self.fp16_peak.flops / peak.flops
            return Reason("compute", finding + ", with fp16/bf16 data",
                          f"the tensor cores would raise the ceiling {gain:.0f}× (FP16/BF16 tensor-core peak "
                          f"{tflops(self.fp16_peak.flops)}): write the product with pnex.tc's mma "
                          f"(m16n8k16 fragments, FP32 accumulators)")
        if share >= FAR:
            return Reason("compute", finding + ": at or near the ceiling", "little is left to gain in this kernel")
        return Reason("compute", finding,
                      "issue fewer instructions per FLOP: fused multiply-adds, and register tiles so that each value "
                      "loaded feeds several of them")


def assess(
    *, flops: int | None, how: str, inferred: bool, kind: str, seconds: float | None, bytes_moved: int | None,
    info: DeviceInfo | None, bandwidth: float | None, sass: str = "", ptx: str = "", dtypes: Sequence[str] = (),
    arch: str = "",
) -> Compute:
    """The :class:`Compute` of one call: ``info`` is the GPU's (``None`` on CPU tensors:
    the count alone); ``kind`` the count's arithmetic where inferred; ``sass``/``ptx``
    the code that ran, for the tensor-core instructions; ``dtypes`` the kernel's
    tensors' dtype names."""
    tensor = tensor_cores(sass, "" if sass else ptx)
    low = any(d in ("float16", "bfloat16") for d in dtypes)
    mix = instruction_mix(sass)
    peak = fp16 = None
    if info is not None:
        if tensor is not None:
            chosen = tensor.kind
        elif kind == "fp64" or (not kind and any(d == "float64" for d in dtypes)) or \
                mix.get("DFMA", 0) > mix.get("FFMA", 0):
            chosen = "fp64"
        else:
            chosen = "fp32"
        peak = peak_flops(info.arch, chosen, info.sm_count, info.sm_clock_hz, info.name)
        fp16 = peak_flops(info.arch, "fp16-tc", info.sm_count, info.sm_clock_hz, info.name)
    return Compute(
        flops=flops, how=how, inferred=inferred, seconds=seconds if info is not None else None,
        bytes_moved=bytes_moved, bandwidth=bandwidth, peak=peak, tensor=tensor, mix=mix, low_precision=low,
        arch=arch or (info.arch if info is not None else ""), device=info.name if info is not None else "",
        fp16_peak=fp16,
    )


def with_compute(efficiency: Any, compute: Compute | None) -> Any:
    """``efficiency`` (an :class:`~pnex_magic.efficiency.Efficiency`) with the reasons of a
    compute-bound call: what holds a launch or a grid back stays first, the compute
    reason comes next, and the bytes-in-flight reason (a memory-bound kernel's) goes;
    anything else is left as it is."""
    reason = compute.reason if compute is not None else None
    if efficiency is None or reason is None:
        return efficiency
    first = tuple(r for r in efficiency.reasons if r.kind in ("launch", "blocks"))
    rest = tuple(r for r in efficiency.reasons if r.kind not in ("launch", "blocks", "in flight"))
    return dataclasses.replace(efficiency, reasons=first + (reason,) + rest)
