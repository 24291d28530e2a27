"""The compute roofline (issue 35, "The report"): a call's FLOP count (the author's
``flops=`` / ``--flops`` expression, or inferred from the PTX), the GPU's compute peaks,
the tensor-core instructions in the code, and the "why" of a compute-bound call, all
without a GPU: the timed figures come from the recorded devices of
:mod:`pnex_magic.profiles`, the counts from kernels compiled here (PTX for sm_75/sm_90
needs no GPU) and evaluated on CPU tensors.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import hardware, roofline
from pnex_magic.efficiency import UNEXPLAINED, Efficiency, Reason
from pnex_magic.errors import ShapeExpressionError
from pnex_magic.profiles import profile
from pnex_magic.render.profile import compute_html

H100 = profile("H100 SXM")
T4 = profile("T4")


@pnex.jit(n_threads=("c.size(1)", "c.size(0)"), flops="2 * a.size(0) * b.size(1) * a.size(1)")
def naive_mm(a: pnex.In("f32", (None, None)), b: pnex.In("f32", (None, None)),
             c: pnex.Out("f32", ("a.size(0)", "b.size(1)"))):
    j, i = cuda.grid(2)
    if i < c.shape[0] and j < c.shape[1]:
        s = 0.0
        for k in range(a.shape[1]):
            s += a[i, k] * b[k, j]
        c[i, j] = s


@pnex.jit(n_threads="a.numel()")
def poly(a: pnex.In("f32", (None,)), alpha: pnex.Scalar("f32"), r: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        x = a[i]
        r[i] = alpha * x * x + x - 1.5  # 1 mul, 1 fma, 1 sub (or 2 fma): 4 FLOPs per thread either way


@pnex.jit(n_threads="a.numel()")
def loops(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        s = 0.0
        for k in range(a.shape[0]):
            s += a[k]
        r[i] = s


# --------------------------------------------------------------------------- the count


def test_flops_is_an_expression_over_the_parameters_evaluated_per_call():
    a, b = torch.rand(64, 32), torch.rand(32, 48)
    report = pnex.inspect(naive_mm, args=(a, b))
    assert report.compute.flops == 2 * 64 * 48 * 32 and not report.compute.inferred
    text = str(report)
    assert "flops     : 197 kFLOP per call = 196,608: 2 * a.size(0) * b.size(1) * a.size(1), given with flops=" in text
    assert "not timed: FLOP/s needs a timed call on the GPU" in text  # no fake rate on CPU
    assert report.compute.rate is None and report.compute.share is None and report.compute.reason is None
    other = pnex.inspect(naive_mm, args=(torch.rand(8, 5), torch.rand(5, 3)))
    assert other.compute.flops == 2 * 8 * 3 * 5


def test_scalars_and_tune_values_may_appear_in_the_count():
    @pnex.jit(n_threads="n", flops="2 * n * K")
    def f(a: pnex.In("f32", (None,)), n: int, r: pnex.Out("f32", "a"), K: pnex.Tune(4)):
        i = cuda.grid(1)
        if i < n:
            r[i] = a[i] * K

    assert pnex.inspect(f, args=(torch.rand(10), 10)).compute.flops == 2 * 10 * 4


@pytest.mark.parametrize("text, message", [
    ("2 * m", r"kernel 'g', flops: unknown name 'm'; the names it may use here are: a, alpha, r"),
    ("2 * alpha", r"scalar 'alpha' is not an integer"),
    ("2.5 * a.numel()", r"only integer constants are allowed"),
    ("   ", r"kernel 'g', flops: empty expression"),
])
def test_a_bad_count_is_refused_at_definition_naming_flops(text, message):
    with pytest.raises(ShapeExpressionError, match=message):
        @pnex.jit(n_threads="a.numel()", flops=text)
        def g(a: pnex.In("f32", (None,)), alpha: float, r: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                r[i] = a[i] * alpha


def test_the_count_is_inferred_from_the_ptx_of_a_kernel_without_loops():
    x = torch.rand(1000)
    report = pnex.inspect(poly, args=(x, 2.0))
    per_thread, kind, why = roofline.ptx_flops(report.ptx, report.entry)
    assert (per_thread, kind, why) == (4, "fp32", "")
    assert report.compute.flops == 4 * 1000 and report.compute.inferred
    assert report.compute.how.startswith("inferred from the PTX: 4 floating-point operations per thread × 1,000 threads")
    assert "4,000: inferred from the PTX" in compute_html(report.compute)


def test_no_count_is_inferred_for_a_loop():
    report = pnex.inspect(loops, args=(torch.rand(10),))
    assert report.compute is None
    per_thread, _, why = roofline.ptx_flops(report.ptx, report.entry)
    assert per_thread is None and "loop" in why


def test_ptx_counting_rules():
    ptx = """
.visible .entry k(
)
{
$L__BB0_1:
	fma.rn.f32 	%f3, %f1, %f2, %f3;
	add.rn.f64 	%fd1, %fd2, %fd3;
	mul.rn.f16x2 	%r1, %r2, %r3;
	@%p1 sqrt.rn.f32 	%f4, %f3;
	mov.f32 	%f5, %f4;
	neg.f32 	%f6, %f5;
	add.s64 	%rd1, %rd2, %rd3;
	ret;
}
"""
    assert roofline.ptx_flops(ptx, "k") == (2 + 1 + 2 + 1, "fp64", "")
    looped = ptx.replace("ret;", "@%p2 bra 	$L__BB0_1;\n\tret;")
    assert roofline.ptx_flops(looped, "k")[0] is None
    called = ptx.replace("ret;", "call.uni helper, ();\n\tret;")
    assert "calls a function" in roofline.ptx_flops(called, "k")[2]
    assert roofline.ptx_flops(ptx, "other")[2] == "no kernel entry in the PTX"


# --------------------------------------------------------------------------- peaks and tensor cores


def test_peaks_from_the_table_the_sms_and_the_clock():
    h100 = hardware.peak_flops("sm_90", "fp16-tc", 132, 1.98e9, "NVIDIA H100 80GB HBM3")
    assert h100.flops == 4096 * 132 * 1.98e9 and "4,096 FLOP per clock per SM × 132 SMs × 1980 MHz" in h100.source
    assert hardware.peak_flops("sm_90", "fp32", 132, 1.98e9).flops == pytest.approx(66.9e12, rel=1e-3)
    # the datasheets' figures, at the clocks they quote
    assert hardware.peak_flops("sm_80", "fp16-tc", 108, 1.41e9).flops == pytest.approx(312e12, rel=0.01)
    assert hardware.peak_flops("sm_80", "tf32-tc", 108, 1.41e9).flops == pytest.approx(156e12, rel=0.01)
    assert hardware.peak_flops("sm_75", "fp16-tc", 40, 1.59e9).flops == pytest.approx(65e12, rel=0.01)
    geforce = hardware.peak_flops("sm_89", "fp16-tc", 128, 2.52e9, "NVIDIA GeForce RTX 4090")
    assert geforce.flops == pytest.approx(165e12, rel=0.01)  # half rate with FP32 accumulation
    assert hardware.peak_flops("sm_87", "fp32", 16, 1.3e9).flops is None  # no row of its own
    assert "no FP16/BF16 tensor-core" in hardware.peak_flops("sm_100", "fp16-tc", 148, 1.9e9).source
    assert hardware.peak_flops("sm_90", "fp32", 132, None).flops is None


SASS_HMMA = """
        Function : _Z2mm
        /*0100*/                   LDSM.16.M88.4 R8, [R2] ;
        /*0110*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0120*/                   HMMA.16816.F32.BF16 R16, R8, R14, R16 ;
        /*0130*/              @!P0 FFMA R1, R2, R3, R1 ;
"""


def test_tensor_core_instructions_in_sass_and_ptx():
    found = roofline.tensor_cores(SASS_HMMA)
    assert (found.instruction, found.kind, found.count, found.precision) == ("HMMA (mma.sync)", "fp16-tc", 2, "BF16")
    hg = roofline.tensor_cores("        /*0200*/                   HGMMA.64x128x16.F32 gdesc[UR4], RZ, !UPT ;")
    assert (hg.instruction, hg.precision) == ("HGMMA (wgmma)", "FP16")
    tf = roofline.tensor_cores("        /*0200*/                   HMMA.1684.F32.TF32 R4, R8, R12, R4 ;")
    assert tf.kind == "tf32-tc"
    assert roofline.tensor_cores("        /*0200*/                   DMMA.884 R4, R8, R12, R4 ;").kind == "fp64-tc"
    ptx = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, ..."
    assert (roofline.tensor_cores("", ptx).instruction, roofline.tensor_cores("", ptx).precision) == ("mma.sync", "FP16")
    assert roofline.tensor_cores("", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32").kind == "tf32-tc"
    assert roofline.tensor_cores(SASS_HMMA.replace("HMMA", "FFMA")) is None
    assert roofline.instruction_mix(SASS_HMMA) == {"LDSM": 1, "HMMA": 2, "FFMA": 1}


# --------------------------------------------------------------------------- a timed call


def timed(flops: int, seconds: float, moved: int, *, device=H100, sass="", dtypes=("float32",), kind=""):
    return roofline.assess(flops=flops, how="given with flops=", inferred=False, kind=kind,
                           seconds=seconds, bytes_moved=moved, info=device.info, bandwidth=device.copy_bandwidth,
                           sass=sass, dtypes=dtypes, arch=device.arch)


def test_a_compute_bound_cuda_core_kernel_with_bf16_data_is_pointed_at_the_tensor_cores():
    n = 4096
    flops, moved = 2 * n**3, 3 * n * n * 2
    c = timed(flops, 5e-3, moved, sass="        /*0100*/                   FFMA R1, R2, R3, R1 ;", dtypes=("bfloat16",))
    fp32 = 256 * 132 * 1.98e9
    assert c.peak.kind == "fp32" and c.rate == pytest.approx(flops / 5e-3) and c.share == pytest.approx(flops / 5e-3 / fp32)
    assert c.bound == "compute" and c.intensity == pytest.approx(flops / moved)
    reason = c.reason
    assert reason.kind == "compute" and "compute-bound" in reason.finding and "with fp16/bf16 data" in reason.finding
    assert "pnex.tc" in reason.advice and "16×" in reason.advice  # 4096 against 256 FLOP per clock per SM
    text = "\n".join(c.lines())
    assert "of the FP32 CUDA-core peak" in text and "compute-bound" in text


def test_an_hmma_kernel_on_hopper_is_told_about_wgmma():
    n = 4096
    c = timed(2 * n**3, 0.4e-3, 3 * n * n * 2, sass=SASS_HMMA, dtypes=("bfloat16",))
    assert c.peak.kind == "fp16-tc" and c.tensor.instruction == "HMMA (mma.sync)"
    assert "uses the tensor cores (2 HMMA (mma.sync), BF16)" in c.reason.finding
    assert "wgmma" in c.reason.advice
    on_ampere = timed(2 * n**3, 0.6e-3, 3 * n * n * 2, device=profile("A100 40GB"), sass=SASS_HMMA,
                      dtypes=("bfloat16",))
    assert "wgmma" not in on_ampere.reason.advice and "keep the tensor cores fed" in on_ampere.reason.advice


def test_a_compute_bound_kernel_whose_sass_uses_local_memory_is_told_to_keep_its_values_in_registers():
    n = 4096
    flops, moved = 2 * n**3, 3 * n * n * 2
    hgmma = "        /*0100*/                   HGMMA.64x256x16.F32 R24, gdesc[UR20], R24 ;\n"
    local = hgmma + ("        /*0200*/                   STL.64 [R1+0x10], R24 ;\n"
                     "        /*0210*/               @P0 LDL.64 R24, [R1+0x10] ;\n"
                     "        /*0220*/                   LDL R26, [R1+0x18] ;\n")
    slow = timed(flops, 0.5e-3, moved, device=H100, sass=local, dtypes=("float16",))
    assert slow.bound == "compute" and slow.share < 0.85
    reason = slow.reason
    assert "local memory (2 LDL, 1 STL)" in reason.finding and "range(N)" in reason.advice
    assert "literal_unroll" in reason.advice
    clean = timed(flops, 0.5e-3, moved, device=H100, sass=hgmma, dtypes=("float16",))
    assert "local memory" not in clean.reason.finding and "keep the tensor cores fed" in clean.reason.advice
    at_peak = timed(flops, flops / (0.95 * slow.peak.flops), moved, device=H100, sass=local, dtypes=("float16",))
    assert "at or near the ceiling" in at_peak.reason.finding  # near the peak, local memory is not the story


def test_a_memory_bound_call_gets_no_compute_reason():
    n = 1 << 24
    c = timed(2 * n, 40e-6, 12 * n)  # saxpy: 2 FLOPs per 12 bytes
    assert c.bound == "memory" and c.reason is None and c.share == pytest.approx(2 * n / 40e-6 / (256 * 132 * 1.98e9))


def test_the_compute_reason_leads_the_why_of_a_compute_bound_call():
    n = 4096
    c = timed(2 * n**3, 5e-3, 3 * n * n * 4, sass="        /*0100*/                   FFMA R1, R2, R3, R1 ;")
    e = Efficiency(op_bandwidth=1e10, eager_bandwidth=None, copy_bandwidth=H100.copy_bandwidth,
                   peak_bandwidth=H100.peak_bandwidth, peak_source="test", device="NVIDIA H100", bytes_moved=1 << 30)
    assert e.explanation is UNEXPLAINED
    assert "--profile" in UNEXPLAINED.advice  # where the report's own figures explain nothing, it offers --profile
    launch = Reason("launch", "launch overhead dominates", "give each call more work")
    flight = Reason("in flight", "too few bytes in flight", "more elements per thread")
    occupancy = Reason("occupancy", "occupancy 25% limited by registers", "cap them")
    mixed = roofline.with_compute(dataclasses.replace(e, reasons=(flight, launch, occupancy)), c)
    assert [r.kind for r in mixed.reasons] == ["launch", "compute", "occupancy"]
    alone = roofline.with_compute(e, c)
    assert alone.explanation.kind == "compute" and "compute-bound" in "\n".join(alone.lines())
    memory = timed(2 * (1 << 24), 40e-6, 12 * (1 << 24))
    assert roofline.with_compute(e, memory) is e and roofline.with_compute(None, c) is None


def test_compute_html_gives_the_rate_the_share_and_the_roofline():
    n = 4096
    c = timed(2 * n**3, 5e-3, 3 * n * n * 4)
    html = compute_html(c)
    assert re.search(r"27\.5 TFLOP/s = 41% of the FP32 CUDA-core peak \(66\.9 TFLOP/s\)", html)
    assert "ridge point" in html and "compute-bound" in html
    cpu = roofline.assess(flops=100, how="given with flops=", inferred=False, kind="", seconds=None,
                          bytes_moved=8, info=None, bandwidth=None)
    assert "not timed" in compute_html(cpu) and cpu.rate is None and cpu.peak is None


def test_no_sm_clock_means_no_peak_and_no_share():
    info = dataclasses.replace(H100.info, sm_clock_hz=None)
    c = roofline.assess(flops=10**12, how="", inferred=False, kind="", seconds=1e-3, bytes_moved=1 << 20, info=info,
                        bandwidth=H100.copy_bandwidth)
    assert c.rate == pytest.approx(1e15) and c.share is None and c.bound is None
    assert "SM clock" in c.peak.source and c.describe().startswith("1,000 TFLOP/s")


# --------------------------------------------------------------------------- %%pnex --flops

IPython = pytest.importorskip("IPython")
from IPython.testing import globalipapp  # noqa: E402

AXPY = '''
def axpy(a: In("f32", (None,)), b: In("f32", "a"), alpha: float, r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = alpha * a[i] + b[i]
'''


@pytest.fixture(scope="module")
def ip():
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "pnex_magic")
    shell.run_cell("import torch\nx = torch.rand(40)")
    return shell


def test_flops_option_of_the_magic(ip, fresh_cache):
    ip.run_cell_magic("pnex", '--n-threads a.numel() --flops "2 * a.numel()" --args (x, x, 3.0) -o rep', AXPY)
    rep = ip.user_ns["rep"]
    assert rep.kernel.compute.flops == 80 and not rep.kernel.compute.inferred
    assert "flops     : 80 FLOP per call = 80: 2 * a.numel(), given with flops=" in rep.to_text()
    assert "given with flops=" in dict(rep.sections())["Timing"]
    ip.run_cell_magic("pnex", "--n-threads a.numel() --args (x, x, 3.0) -o rep", AXPY)
    assert ip.user_ns["rep"].kernel.compute.inferred and ip.user_ns["rep"].kernel.compute.flops == 80  # one fma


def test_a_bad_flops_option_points_at_the_magic_line(ip, fresh_cache):
    with pytest.raises(ShapeExpressionError) as info:
        ip.run_cell_magic("pnex", '--n-threads a.numel() --flops "2 * n" --args (x, x, 3.0)', AXPY)
    assert str(info.value).startswith("cell line 1 (the %%pnex line): kernel 'axpy', flops: unknown name 'n'")
