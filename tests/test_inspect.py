"""``pnex.inspect``: the report on what was built (schema, PTX, resources), without a GPU."""

import dataclasses
import re

import numba
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.arch import DEFAULT_ARCH, arch_name, default_arch, parse_arch
from pnex_magic.report import KernelReport, occupancy


@pnex.jit(n_threads="a.numel()")
def plain_copy(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
    x = cuda.grid(1)
    if x < a.shape[0]:
        result[x] = a[x]


TILE = 8
HALO_TILE = TILE + 2


@pnex.jit(n_threads=("out.size(1)", "out.size(0)"), threads_per_block=(TILE, TILE), to_extension=True)
def blur(u: pnex.In("f32", (None, None)), out: pnex.Out("f32", "u")):
    tile = cuda.shared.array((HALO_TILE, HALO_TILE), numba.float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    x, y = cuda.grid(2)
    for j in range(ty, HALO_TILE, TILE):
        for i in range(tx, HALO_TILE, TILE):
            gy = min(max(cuda.blockIdx.y * TILE + j - 1, 0), u.shape[0] - 1)
            gx = min(max(cuda.blockIdx.x * TILE + i - 1, 0), u.shape[1] - 1)
            tile[j, i] = u[gy, gx]
    cuda.syncthreads()
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = (tile[ty, tx + 1] + tile[ty + 2, tx + 1] + tile[ty + 1, tx] + tile[ty + 1, tx + 2]) * 0.25


def test_report_fields():
    report = pnex.inspect(plain_copy)
    assert isinstance(report, KernelReport)
    op_name = plain_copy.definition.op_name
    assert report.name == "plain_copy"
    assert report.op_name == f"pnex::{op_name}"
    assert report.schema == f"pnex::{op_name}(Tensor a) -> Tensor"
    assert report.signature == "plain_copy(a: Tensor[float32, (None,)]) -> Tensor[float32, (a.size(0),)]"
    assert "def plain_copy(" in report.source
    assert report.n_threads == ("a.numel()",)
    assert report.threads_per_block == (256,)
    assert report.arch == default_arch()
    assert ".entry" in report.ptx
    assert f".entry {report.entry}(" in report.ptx
    assert f".target {report.arch}" in report.ptx
    assert report.registers > 0
    assert report.shared_bytes == 0
    assert report.local_bytes == 0
    assert report.const_bytes > 0
    assert report.spills is False
    assert 0 < report.occupancy <= 1
    assert re.fullmatch(r"[0-9a-f]{64}", report.cache_key)
    assert report.compile_seconds >= 0
    assert "registers" in report.link_log
    assert report.to_extension is False
    assert report.max_registers is None
    assert report.grid is None and report.block is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.registers = 1  # a plain, immutable result


def test_default_arch_without_gpu(monkeypatch):
    monkeypatch.delenv("PNEX_ARCH", raising=False)
    if not torch.cuda.is_available():
        assert default_arch() == DEFAULT_ARCH == "sm_75"
    monkeypatch.setenv("PNEX_ARCH", "8.6")
    assert default_arch() == "sm_86"


def test_shared_memory_reported():
    report = pnex.inspect(blur)
    assert report.shared_bytes == HALO_TILE * HALO_TILE * 4
    assert report.threads_per_block == (TILE, TILE)
    assert report.n_threads == ("out.size(1)", "out.size(0)")
    assert report.to_extension is True
    u = torch.arange(30, dtype=torch.float32).view(5, 6)
    padded = torch.nn.functional.pad(u[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
    expected = (padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]) * 0.25
    torch.testing.assert_close(blur(u), expected)


def test_other_architecture():
    report = pnex.inspect(plain_copy, arch="sm_90")
    assert report.arch == "sm_90"
    assert ".target sm_90" in report.ptx
    assert report.registers > 0
    assert report.cache_key != pnex.inspect(plain_copy).cache_key
    # other spellings of the same target
    for spelling in ("90", 90, (9, 0), "9.0", "compute_90"):
        assert pnex.inspect(plain_copy, arch=spelling).arch == "sm_90"
    # the op's own target is unchanged
    assert pnex.inspect(plain_copy).arch == default_arch()


def test_jit_arch_option():
    @pnex.jit(n_threads="a.numel()", arch="sm_80")
    def for_ampere(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    report = pnex.inspect(for_ampere)
    assert report.arch == "sm_80" and ".target sm_80" in report.ptx


def test_arch_parsing():
    assert parse_arch("sm_75") == (7, 5)
    assert parse_arch("sm_90a") == (9, 0)
    assert parse_arch("120") == (12, 0)
    assert arch_name((10, 0)) == "sm_100"


def test_report_with_example_arguments():
    a = torch.zeros(600)
    report = pnex.inspect(plain_copy, args=(a,))
    assert report.grid == (3, 1, 1)
    assert report.block == (256, 1, 1)
    assert "grid      : (3, 1, 1) blocks x (256, 1, 1) threads" in str(report)
    u = torch.zeros(20, 9)
    report = pnex.inspect(blur, args=(u,))
    assert report.grid == (2, 3, 1) and report.block == (8, 8, 1)


def test_text_and_pretty_forms():
    report = pnex.inspect(blur)
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == f"pnex kernel 'blur' (pnex::{blur.definition.op_name})"
    for label in ("signature :", "schema    :", "launch    :", "target    :", "registers :", "shared    :", "local     :", "occupancy :", "ptx       :"):
        assert any(line.strip().startswith(label.strip()) for line in lines), label
    assert f"registers : {report.registers} per thread" in text
    assert "shared    : 400 B" in text
    assert "n_threads=('out.size(1)', 'out.size(0)') threads_per_block=(8, 8)" in text

    from IPython.lib.pretty import pretty

    assert pretty(report) == text

    class Printer:
        def __init__(self):
            self.parts = []

        def text(self, s):
            self.parts.append(s)

    p = Printer()
    report._repr_pretty_(p, cycle=True)
    assert p.parts == ["KernelReport(...)"]


def make_hungry(max_registers):
    @pnex.jit(n_threads="a.size(0)", max_registers=max_registers)
    def hungry(a: pnex.In("f64", (None, 8)), out: pnex.Out("f64", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            v0 = a[i, 0]
            v1 = a[i, 1]
            v2 = a[i, 2]
            v3 = a[i, 3]
            v4 = a[i, 4]
            v5 = a[i, 5]
            v6 = a[i, 6]
            v7 = a[i, 7]
            for _ in range(8):
                w0 = v0 * v1 + v2
                w1 = v1 * v2 + v3
                w2 = v2 * v3 + v4
                w3 = v3 * v4 + v5
                w4 = v4 * v5 + v6
                w5 = v5 * v6 + v7
                w6 = v6 * v7 + v0
                w7 = v7 * v0 + v1
                v0 = w0 / (1.0 + w7 * w7)
                v1 = w1 / (1.0 + w6 * w6)
                v2 = w2 / (1.0 + w5 * w5)
                v3 = w3 / (1.0 + w4 * w4)
                v4 = w4 / (1.0 + w3 * w3)
                v5 = w5 / (1.0 + w2 * w2)
                v6 = w6 / (1.0 + w1 * w1)
                v7 = w7 / (1.0 + w0 * w0)
            out[i, 0] = v0
            out[i, 1] = v1
            out[i, 2] = v2
            out[i, 3] = v3
            out[i, 4] = v4
            out[i, 5] = v5
            out[i, 6] = v6
            out[i, 7] = v7

    return hungry


def hungry_reference(a):
    v = [a[:, k].clone() for k in range(8)]
    for _ in range(8):
        w = [v[k] * v[(k + 1) % 8] + v[(k + 2) % 8] for k in range(8)]
        v = [w[k] / (1.0 + w[7 - k] * w[7 - k]) for k in range(8)]
    return torch.stack(v, dim=1)


def test_max_registers_respected():
    free = pnex.inspect(make_hungry(None))
    assert free.registers > 32, "the test kernel should need many registers"
    capped_op = make_hungry(32)
    capped = pnex.inspect(capped_op)
    assert capped.max_registers == 32
    assert capped.registers <= 32
    # the capped kernel computes the same thing (on CPU the simulator ignores the cap);
    # called now, while it is the live definition of its name
    a = torch.rand(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(capped_op(a), hungry_reference(a))
    tight = pnex.inspect(make_hungry(16))
    # ptxas raises a cap below its per-architecture lower bound (24 on sm_75 with
    # CUDA 13) and says so in the log; the cap is honoured down to that bound.
    bound = re.search(r"lower bound of (\d+)", tight.link_log)
    limit = max(16, int(bound.group(1))) if bound else 16
    assert tight.registers <= limit < free.registers
    assert tight.spills and tight.local_bytes > 0
    assert "SPILLS" in str(tight)
    if tight.registers > 16:
        assert f"(max_registers=16 is below ptxas's minimum for {tight.arch})" in str(tight)
    assert "below ptxas's minimum" not in str(capped)


def test_verbose_prints_a_summary(capsys):
    @pnex.jit(n_threads="a.numel()", verbose=True)
    def chatty(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    printed = capsys.readouterr().out
    assert "pnex: chatty(a: Tensor[float32, (None,)])" in printed
    assert f"pnex: schema pnex::{chatty.definition.op_name}(Tensor a) -> Tensor" in printed
    assert re.search(r"pnex: \d+ registers/thread, 0 B shared", printed)


def test_occupancy():
    assert occupancy("sm_75", 32, 0, 256) == 1.0
    assert occupancy("sm_75", 64, 0, 256) == 1.0  # 4 blocks of 8 warps fill sm_75's 32
    assert occupancy("sm_75", 128, 0, 256) == 0.5  # registers allow 2 blocks
    assert occupancy("sm_75", 32, 48 * 1024, 256) == 0.25  # one block fits in shared memory
    assert occupancy("sm_90", 32, 0, 1024) == 1.0
    assert occupancy("sm_30", 32, 0, 256) is None
    assert occupancy("sm_75", 32, 0, 0) is None


def test_the_default_arch_is_read_from_the_driver_before_pytorch_starts_cuda(monkeypatch):
    """Until PyTorch's CUDA is initialised the driver answers (for device 0: what
    PyTorch's current device will be), so that compiling starts no CUDA context; once it
    is, PyTorch's current device answers; without a driver answer, PyTorch does."""
    import torch

    from pnex_magic import arch

    monkeypatch.delenv("PNEX_ARCH", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 6))
    asked = []
    monkeypatch.setattr(arch, "_driver_capability", lambda index: asked.append(index) or (9, 0))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert arch.default_arch() == "sm_90" and asked == [0]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert arch.default_arch() == "sm_86" and asked == [0]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(arch, "_driver_capability", lambda index: None)
    assert arch.default_arch() == "sm_86"
