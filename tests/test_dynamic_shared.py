"""Dynamic shared memory (``shared_bytes=``, ``%%pnex --shared-bytes``) without a GPU.

A kernel declares it with Numba's idiom ``cuda.shared.array(0, dtype)`` (every such
array aliases the same bytes) and carves tiles from it; its definition says how many
bytes each ``Tune`` variant launches with.  Here: the CUDA simulator gives a block the
bytes asked (numba's own and pnex's grid simulator), the option is checked at
definition (naming it), the bytes travel in the launch description and saved
artifacts, the autotuner and the residency check count them, and the report shows
them.  ``tests/test_dynamic_shared_gpu.py`` launches such kernels on a GPU through both
GPU launchers and JAX's.
"""

from __future__ import annotations

import torch
import pytest
from numba import cuda, float32, float64, int32

import pnex_magic as pnex
from pnex_magic import KernelDefinitionError, Tune, hardware
from pnex_magic.artifact.manifest import op_entry, read_op_entry
from pnex_magic.define import definition as make_definition
from pnex_magic.errors import ArtifactError, KernelLaunchError
from pnex_magic.launch import cooperative, launcher_for
from pnex_magic.launch.description import describe_launch
from pnex_magic.launch.shared import limit_message
from pnex_magic.multiarch import ArchImages

TILE = 128  # a 128 x 128 float32 tile: 64 KiB, above static shared memory's 48 KiB


def _transpose_tiles():
    """Each block stages one 128 x 128 tile of ``x`` through 64 KiB of dynamic shared
    memory, written through one view and read through another, reshaped, view of the
    same bytes: ``out[b] = x[b].T``."""

    @pnex.jit(n_threads="x.size(0) * 128", threads_per_block=TILE, shared_bytes=TILE * TILE * 4)
    def transpose_tiles(x: pnex.In("f32", (None, 128, 128)), out: pnex.Out("f32", "x")):
        stage = cuda.shared.array(0, float32)
        tile = cuda.shared.array(0, float32)[:16384].reshape((128, 128))  # the same bytes
        b = cuda.blockIdx.x
        t = cuda.threadIdx.x
        for c in range(128):
            stage[t * 128 + c] = x[b, t, c]
        cuda.syncthreads()
        for c in range(128):
            out[b, c, t] = tile[t, c]

    return transpose_tiles


def test_a_kernel_with_64_kib_of_dynamic_shared_memory_runs_in_the_simulator():
    op = _transpose_tiles()
    assert op.spec.shared_per_variant == (65536,)
    x = torch.randn(2, TILE, TILE)
    out = op(x)
    assert torch.equal(out, x.transpose(1, 2))  # every element passed through shared memory


def test_the_simulator_gives_the_block_the_bytes_of_the_variant_launched():
    """Each Tune variant its own bytes: the dynamic array's length is bytes // itemsize."""

    def lengths(out: pnex.Out("i32", (2,)), ROWS: Tune(1, 4)):
        if cuda.grid(1) == 0:
            out[0] = cuda.shared.array(0, int32).shape[0]
            out[1] = cuda.shared.array(0, float64).shape[0]

    op = pnex.jit(n_threads=1, threads_per_block=32, shared_bytes="ROWS * 1024 + 8")(lengths)
    assert op.spec.shared_per_variant == (1032, 4104)
    assert op().tolist() == [258, 129]  # the first variant, as the simulator runs
    out = torch.full((2,), -1, dtype=torch.int32)
    values = [out, 4]  # the kernel's parameters for variant 1: the output, then ROWS
    launcher_for(torch.device("cpu")).launch(op.definition, values, (1, 1, 1), (32, 1, 1), torch.device("cpu"), 1)
    assert out.tolist() == [1026, 513]


def test_every_block_has_dynamic_shared_memory_of_its_own_in_the_grid_simulator():
    """A grid-synchronising kernel runs with every block at once: each block's dynamic
    shared memory is its own (a shared buffer would show another block's values)."""

    @pnex.jit(n_threads="x.size(0)", threads_per_block=8, shared_bytes=8 * 4)
    def own(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
        smem = cuda.shared.array(0, float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        smem[t] = x[i]
        cuda.cg.this_grid().sync()
        out[i] = smem[7 - t]

    x = torch.randn(24)  # 3 blocks of 8, all running at once
    assert torch.equal(own(x), x.view(3, 8).flip(1).reshape(-1))


def test_a_checked_launch_bounds_checks_the_dynamic_array_by_the_bytes_given():
    from pnex_magic.errors import KernelIndexError

    @pnex.jit(n_threads=32, threads_per_block=32, shared_bytes=32 * 4, check=True)
    def past_the_end(out: pnex.Out("f32", (32,))):
        smem = cuda.shared.array(0, float32)
        t = cuda.threadIdx.x
        smem[t + 1] = 1.0  # thread 31 writes element 32 of 32

    with pytest.raises(KernelIndexError, match=r"index 32 is out of bounds for axis 0 of .*'smem'.* \(32,\)"):
        past_the_end()


# ---------------------------------------------------------------------------- the option


def _body(out: pnex.Out("f32", (4,)), n: int, BM: Tune(64, 128), SCALE: Tune(0.5, 1.0)):
    out[0] = 1.0


def _define(shared_bytes, fn=_body):
    return make_definition(fn, n_threads=1, shared_bytes=shared_bytes)


def test_the_option_is_an_int_or_an_expression_over_tune_parameters_per_variant():
    d = _define("BM * 4 * 64 + max(BM, 96) // 32")
    assert d.spec.tune_variants == ((64, 0.5), (64, 1.0), (128, 0.5), (128, 1.0))
    assert d.spec.shared_per_variant == (16387, 16387, 32772, 32772)
    assert _define(4096).spec.shared_per_variant == (4096,) * 4
    assert _define(0).spec.shared_per_variant == (0,) * 4
    assert "shared_bytes=" not in _define(0).spec.describe()  # the interface text (cache keys) of kernels without it
    assert _define("BM * 8").spec.describe() != _define("BM * 16").spec.describe()


@pytest.mark.parametrize("value, message", [
    (-1, r"shared_bytes = -1 gives -1 bytes; it cannot be negative"),
    ("64 - BM * 2", r"with the Tune choice BM=64 gives -64 bytes; it cannot be negative"),
    (1.5, r"shared_bytes: expected an int .* got 1\.5"),
    (True, r"shared_bytes: expected an int"),
    ("BM * 1.5", r"shared_bytes: only integer constants are allowed"),
    ("out.numel() * 4", r"shared_bytes = 'out.numel\(\) \* 4' names 'out', a tensor; shared_bytes may use only Tune"),
    ("n * 4", r"names 'n', a scalar argument; shared_bytes may use only Tune parameters \(BM, SCALE\)"),
    ("SCALE * 4", r"'SCALE' is not an integer"),
    ("4096 // (BM - 64)", r"with the Tune choice BM=64: division by zero"),
    ("BM * 2048", r"with the Tune choice BM=128 gives 262,144 bytes .* more than any GPU allows a block \(232,448 B"),
    (232449, r"232,449 bytes .* more than any GPU allows"),
    ("BM +", r"shared_bytes: 'BM \+' is not a valid expression"),
])
def test_bad_values_are_refused_at_definition_naming_the_option(value, message):
    with pytest.raises(KernelDefinitionError, match=message):
        _define(value)


def test_the_largest_any_gpu_allows_is_227_kib():
    assert hardware.MAX_SHARED_PER_BLOCK == 232448 == 227 * 1024
    assert hardware.max_shared_per_block("sm_80") == 163 * 1024
    assert hardware.max_shared_per_block("sm_90") == 227 * 1024
    assert hardware.max_shared_per_block("sm_86") == 99 * 1024
    assert _define(232448).spec.shared_per_variant[0] == 232448  # exactly the limit: accepted


def test_above_the_known_gpus_limit_is_refused_at_definition():
    """Where the GPU is known (arch=, $PNEX_ARCH, the GPU present), its limit applies to
    every variant's bytes at definition."""

    def k(out: pnex.Out("f32", (1,)), STAGES: Tune(2, 5)):
        out[0] = 1.0

    def on(arch, shared_bytes):
        return make_definition(k, n_threads=1, shared_bytes=shared_bytes,
                               options=pnex.definition.JitOptions.checked(arch=arch))

    with pytest.raises(KernelDefinitionError, match=(
            r"kernel 'k': shared_bytes = STAGES \* 40 \* 1024 gives 204,800 B of dynamic shared memory per block "
            r"with the Tune choice STAGES=5, but a block may use at most 166,912 B on sm_80; use fewer pipeline "
            r"stages or smaller tiles, or remove that choice")):
        on("sm_80", "STAGES * 40 * 1024").check_shared_memory()
    on("sm_90", "STAGES * 40 * 1024").check_shared_memory()  # 200 KiB fits sm_90's 227 KiB
    on("sm_80", "STAGES * 32 * 1024").check_shared_memory()  # 160 KiB fits sm_80's 163 KiB
    with pytest.raises(KernelDefinitionError, match=r"101,376 B on sm_86"):
        on("sm_86", 100 * 1024).check_shared_memory()


def test_without_arch_the_limit_of_pnex_arch_or_the_gpu_present_applies(monkeypatch):
    def k(out: pnex.Out("f32", (1,))):
        out[0] = 1.0

    monkeypatch.setenv("PNEX_ARCH", "sm_86")
    with pytest.raises(KernelDefinitionError, match=r"at most 101,376 B on sm_86 \(this GPU\)"):
        make_definition(k, n_threads=1, shared_bytes=200 * 1024).check_shared_memory()
    monkeypatch.delenv("PNEX_ARCH")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: its limit applies")
    make_definition(k, n_threads=1, shared_bytes=200 * 1024).check_shared_memory()  # no GPU known: not refused


# ---------------------------------------------------------------------------- what carries the bytes


def test_the_launch_description_holds_the_bytes_per_variant():
    d = _define("BM * 512")
    assert describe_launch(d.spec)["shared"] == [32768, 32768, 65536, 65536]
    assert describe_launch(_define(0).spec)["shared"] == [0, 0, 0, 0]


def _images() -> dict[str, ArchImages]:
    ptx = ".version 8.0\n.target sm_90\n.visible .entry k(\n)\n{\n}\n"
    return {layout: ArchImages(layout=layout, ptx_arch="sm_90", entry="k", ptx=ptx, cubins={"sm_90": b"\x7fELF"})
            for layout in ("C", "A")}


def _saved(spec):
    entry, files = op_entry("k_1", spec, tuple(_images() for _ in spec.tune_variants), None, None)
    return entry, files


def test_a_saved_manifest_round_trips_the_bytes_and_older_ones_read_as_none():
    spec = _define("BM * 512 + 16").spec
    entry, files = _saved(spec)
    assert entry["spec"]["shared_bytes"] == "BM * 512 + 16" and entry["launch"]["shared"] == [32784] * 2 + [65552] * 2
    back = read_op_entry(entry, files, "x.pnex").spec
    assert back.shared_per_variant == spec.shared_per_variant and str(back.shared_bytes) == "BM * 512 + 16"
    # Saved before dynamic shared memory (formats 1 to 3): no field, no bytes.
    plain, files = _saved(_define(0).spec)
    del plain["spec"]["shared_bytes"], plain["launch"]["shared"]
    assert read_op_entry(plain, files, "old.pnex").spec.shared_per_variant == (0,) * 4
    # A file that lost the text but kept the bytes, or whose text is bad, is refused.
    lost = dict(entry, spec={k: v for k, v in entry["spec"].items() if k != "shared_bytes"})
    with pytest.raises(ArtifactError, match="does not give the saved launch description"):
        read_op_entry(lost, files, "x.pnex")
    bad = dict(entry, spec={**entry["spec"], "shared_bytes": "__import__('os')"})
    with pytest.raises(ArtifactError, match=r"op 'k_1' is malformed.*shared_bytes"):
        read_op_entry(bad, files, "x.pnex")


def test_save_and_load_keep_the_bytes(tmp_path):
    op = _transpose_tiles()
    path = pnex.save(op, tmp_path / "t.pnex", archs=("sm_90",))
    loaded = pnex.load(path)
    assert loaded._pnex.spec.shared_per_variant == (65536,)
    assert str(loaded._pnex.spec.shared_bytes) == "65536"


# ---------------------------------------------------------------------------- occupancy, tuning, residency


def test_occupancy_and_residency_count_dynamic_shared_memory():
    # sm_90: 228 KiB per SM; ptxas's static figure holds the 1 KiB the system keeps per block.
    assert hardware.resident_blocks("sm_90", 32, 1024 + 100 * 1024, 128) == 2
    assert hardware.resident_blocks("sm_90", 32, 1024 + 113 * 1024, 128) == 2  # 2 x (1 + 113) = 228 KiB
    assert hardware.resident_blocks("sm_90", 32, 1024 + 113 * 1024 + 1, 128) == 1
    assert hardware.resident_blocks("sm_90", 32, 227 * 1024, 128) == 1
    assert hardware.resident_blocks("sm_90", 32, 227 * 1024 + 1, 128) == 0
    # sm_80: 164 KiB per SM, and the 1 KiB kept per block comes on top of ptxas's figure.
    assert hardware.resident_blocks("sm_80", 32, 81 * 1024, 128) == 2  # 2 x (81 + 1) = 164 KiB
    assert hardware.resident_blocks("sm_80", 32, 81 * 1024 + 1, 128) == 1
    assert hardware.resident_blocks("sm_80", 32, 0, 128) == 16  # no shared memory: the threads limit
    assert hardware.occupancy_limiter("sm_90", 32, 100 * 1024, 128) == (8 / 64, "shared memory")
    problem = hardware.block_problem("sm_80", 32, 8 * 1024, (128,), (1024,), dynamic_shared=160 * 1024)
    assert problem == ("uses 172,032 B of shared memory per block (8,192 B static + 163,840 B dynamic, shared_bytes), "
                       "above the 166,912 B a block may use on sm_80")
    assert hardware.block_problem("sm_90", 32, 8 * 1024, (128,), (1024,), dynamic_shared=160 * 1024) is None
    # A cooperative launch: every block resident, 2 per SM with 100 KiB each.
    assert cooperative.candidate_problem("k", "sm_90", 32, 1024, (128,), (128 * 264,), 132, 100 * 1024) is None
    assert "at most 2 such blocks per SM x 132 SMs = 264" in cooperative.candidate_problem(
        "k", "sm_90", 32, 1024, (128,), (128 * 265,), 132, 100 * 1024)
    assert "at most 1 such blocks per SM" in cooperative.candidate_problem(
        "k", "sm_90", 32, 1024, (128,), (128 * 133,), 132, 120 * 1024)


def test_the_autotuner_skips_a_variant_whose_bytes_do_not_fit(monkeypatch):
    """Each Tune variant launches with its own bytes; one above the GPU's limit is skipped
    with the reason, before anything runs."""
    from pnex_magic.compiler import ResourceUsage
    from pnex_magic.launch import autotune

    def k(out: pnex.Out("f32", (1,)), STAGES: Tune(2, 4)):
        out[0] = 1.0

    d = make_definition(k, n_threads=1, shared_bytes="STAGES * 48 * 1024")
    ran = []

    class Compiled:
        resources = ResourceUsage(registers=32, shared_bytes=0, local_bytes=0, const_bytes=0, stack_bytes=0,
                                  spill_store_bytes=0, spill_load_bytes=0, barriers=1)

    monkeypatch.setattr(d, "compiled", lambda arch=None, layout="C", variant=0: Compiled())
    d._cooperative = False
    runner = autotune.Runner(lambda i: ran.append(i) or [torch.zeros(1)], lambda: None, lambda v: (1,),
                             torch.device("cpu"))
    result = autotune._benchmark(d, runner, (1,), "key", "GPU", "sm_80", "C", seconds=lambda call, device: 1e-6)
    assert ran == [0]  # the first variant (96 KiB) ran; the second (192 KiB, above sm_80's 163 KiB) never
    (skipped,) = [row for row in result.candidates if row.skipped]
    assert skipped.variant == 1 and "196,608 B of shared memory per block" in skipped.skipped


def test_the_limit_message_names_kernel_option_bytes_and_limit():
    text = limit_message("gemm", 240 * 1024, 1024, 232448, "cuda:0")
    assert text == (
        "kernel 'gemm': shared_bytes asks for 245760 B of dynamic shared memory per block, but cuda:0 allows a block "
        "at most 232448 B of shared memory (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), and the kernel's "
        "static shared memory takes 1024 B of it, which leaves 231424 B for shared_bytes. Ask for at most 231424 B "
        "(fewer pipeline stages or smaller tiles), or run it on a GPU with more shared memory"
    )
    from pnex_magic.launch import build

    header = (build.CSRC / "shared_memory.h").read_text()
    # The C++ launchers' message is the same sentence (the numbers are filled in there).
    for part in ("B of dynamic shared memory per block, but ", " B of shared memory (CU_DEVICE_ATTRIBUTE_MAX_SHARED_"
                 "MEMORY_PER_BLOCK_OPTIN), and the kernel's static \"\n           \"shared memory takes ",
                 " B for shared_bytes. Ask for at most ", " B (fewer pipeline stages or smaller tiles), or run it \"\n"
                 "           \"on a GPU with more shared memory"):
        assert part in header, part


# ---------------------------------------------------------------------------- the report and the magic


def test_inspect_shows_the_dynamic_bytes_and_counts_them_in_occupancy():
    op = _transpose_tiles()
    report = pnex.inspect(op)
    assert report.dynamic_shared_bytes == 65536 and report.shared_bytes_text == "65536"
    if report.registers is not None:  # compiled here
        assert "0 B static + 65,536 B dynamic (shared_bytes = 65536)" in str(report)
        assert report.occupancy == hardware.occupancy(report.arch, report.registers, report.shared_bytes + 65536, 128)


def test_the_magic_takes_shared_bytes(tmp_path, monkeypatch):
    from IPython.testing import globalipapp

    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))
    ip = globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "pnex_magic")
    line = "--n-threads 1 --threads-per-block 32 --shared-bytes 'ROWS * 1024' --tune ROWS=2,3 -o dyn_rep"
    ip.run_cell_magic("pnex", line, (
        "from numba import int32\n"
        "def dyn_lengths(out: Out('i32', (1,)), ROWS: Tune(1)):\n"
        "    if cuda.grid(1) == 0:\n"
        "        out[0] = cuda.shared.array(0, int32).shape[0]\n"
    ))
    op = ip.user_ns["dyn_lengths"]
    assert op.spec.shared_per_variant == (2048, 3072)
    assert op().tolist() == [512]
    report = ip.user_ns["dyn_rep"]
    assert "2,048 B of dynamic shared memory per block" in report.launch_html()
    assert "ROWS * 1024" in report.launch_html()
    assert "2,048 B dynamic shared memory per block" in report.summary()
    if report.kernel.registers is not None:  # compiled here: the Resources tab and the text
        assert "shared memory per block (dynamic, shared_bytes)" in report.resources_html()
        assert "B dynamic (shared_bytes = ROWS * 1024)" in report.to_text()
    with pytest.raises(KernelDefinitionError, match=r"shared_bytes = 'x.numel\(\)' names 'x', a tensor"):
        ip.run_cell_magic("pnex", "--n-threads x.numel() --shared-bytes x.numel()", (
            "def dyn_bad(x: In('f32', (None,)), out: Out('f32', 'x')):\n"
            "    out[0] = x[0]\n"
        ))


def test_a_launch_over_the_device_limit_is_a_clear_error_from_the_python_launcher(monkeypatch):
    """The driver launcher's check, with cuda.bindings' answers stood in for a device."""
    from pnex_magic.launch import shared

    class Driver:
        class CUresult:
            CUDA_SUCCESS = 0

        class CUfunction_attribute:
            CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = "static"
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = "max dynamic"

        class CUdevice_attribute:
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = "optin"

        set_to: list = []

        @staticmethod
        def cuFuncGetAttribute(attribute, fn):
            return 0, 2048

        @staticmethod
        def cuDeviceGet(index):
            return 0, index

        @staticmethod
        def cuDeviceGetAttribute(attribute, dev):
            return 0, 232448

        @classmethod
        def cuFuncSetAttribute(cls, fn, attribute, value):
            cls.set_to.append((attribute, value))
            return (0,)

    import cuda.bindings

    monkeypatch.setattr(cuda.bindings, "driver", Driver, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "cuda.bindings.driver", Driver)
    shared.prepare("fn", "k", 40 * 1024, 0)  # 2 KiB static + 40 KiB: under 48 KiB, no opt-in
    assert Driver.set_to == []
    shared.prepare("fn", "k", 100 * 1024, 0)
    assert Driver.set_to == [("max dynamic", 102400)]
    with pytest.raises(KernelLaunchError, match=r"kernel 'k': shared_bytes asks for 231424 B .* cuda:1 allows a block at "
                                                r"most 232448 B .* static shared memory takes 2048 B"):
        shared.prepare("fn", "k", 226 * 1024, 1)
