"""The JAX front end: pnex ops as JAX functions (``pnex_magic.jax_op``).

CPU tests run every call through ``jax.pure_callback`` and numba-cuda's CUDA
simulator (what the ``pnex_launch`` primitive lowers to on the CPU backend), so
sizes are tiny and blocks small; results are checked against ``jax.numpy`` on
fresh random inputs and errors against the PyTorch op's own.  This file: the GPU branch as far as
it goes without a GPU: its lowering (the FFI call, its attributes and aliases, exported for the
``cuda`` platform), the Python callback until the handler is built, and the FFI handler's build.
"""

import ctypes
import os
import subprocess

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU in one process

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")

import pnex_magic as pnex  # noqa: E402
from pnex_magic.launch import background, build, xla  # noqa: E402

from jax_kernels import accumulate, randn


# ------------------------------------------------------------------------------- the GPU branch, without a GPU


def _cuda_module_text(fn, *args):
    exported = jax.export.export(
        jax.jit(fn), platforms=["cuda"], disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(xla.TARGET)]
    )(*args)
    return exported.mlir_module()


def test_cuda_lowering_is_one_ffi_call_aliasing_only_the_inmut_argument():
    f = pnex.jax_op(accumulate)
    a = randn(40)
    text = _cuda_module_text(lambda a, m: f(a, m, 2.0), a, a)
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert len(calls) == 1 and f"@{xla.TARGET}(%arg0, %arg1)" in calls[0]  # the two arguments, no filled buffers
    assert "stablehlo.case" not in text and "callback" not in text  # lowered for CUDA alone: no platform switch
    call = calls[0]
    assert "grid = dense<[2, 1, 1]>" in call and "block = dense<[32, 1, 1]>" in call
    slot = xla.scalar_slots(accumulate.spec, {"c": 2.0})
    assert slot == [int(np.float32(2.0).view(np.int32))] and f"scalars = dense<{slot[0]}>" in call
    # results (hist, even, m): only m aliases an operand (1, the InMut argument); the handler fills
    # hist (int32 0: bytes of 0) and even (float32 1.5: 32-bit pattern 0x3FC00000) with memsets
    assert call.count("output_operand_alias<") == 1
    assert "output_tuple_indices = [2], operand_index = 1," in call
    assert f"fill = dense<[1, 0, 4, {0x3FC00000}, 0, 0]>" in call
    cpu = jax.jit(lambda a, m: f(a, m, 2.0)).lower(a, a).as_text()
    assert xla.TARGET not in cpu and "callback" in cpu and "stablehlo.case" not in cpu


def test_a_gpu_trace_uses_a_python_callback_until_the_handler_is_built(monkeypatch):
    """On a machine with GPUs (pretended here), a trace lowered for CUDA while the XLA
    handler is not built launches through ``jax.experimental.buffer_callback`` (the
    Python driver launcher on XLA's buffers, the InMut result aliased as for the
    handler); once it is built, a new trace calls it; an export always names it."""
    from pnex_magic.frontends import jax as jax_front

    f = pnex.jax_op(accumulate)
    a = randn(40)
    monkeypatch.setattr(jax_front, "_cuda_archs", lambda: ("9.0",))
    asked = []
    monkeypatch.setattr(xla, "ready", lambda verbose=False: asked.append(verbose) or False)

    def cuda_text():
        return jax.jit(lambda a, m: f(a, m, 2.0)).trace(a, a).lower(lowering_platforms=("cuda",)).as_text()

    waiting = cuda_text()
    assert "xla_buffer_python_gpu_callback" in waiting and xla.TARGET not in waiting and asked
    [call] = [line for line in waiting.splitlines() if "xla_buffer_python_gpu_callback" in line]
    assert call.count("output_operand_alias<") == 1 and "output_tuple_indices = [2], operand_index = 1," in call
    assert xla.TARGET in _cuda_module_text(lambda a, m: f(a, m, 2.0), a, a)  # an export: the handler
    monkeypatch.setattr(xla, "ready", lambda verbose=False: True)
    monkeypatch.setattr(jax_front, "_kernel_id", lambda definition, variant=0: 7)
    built = cuda_text()
    assert xla.TARGET in built and "callback" not in built


def test_the_handler_builds_in_a_background_process_and_serves_once_built(monkeypatch, tmp_path):
    """xla.ready() starts the handler's build in the background (once) and says no; with
    PNEX_LAUNCHER=driver it never uses the handler; once a build is there it loads it."""
    from pnex_magic.launch import background

    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PNEX_LAUNCHER", "auto")
    monkeypatch.setattr(xla, "_library", None)
    monkeypatch.setattr(xla, "_targets", {})
    monkeypatch.setattr(xla, "_include_dirs", lambda: [str(tmp_path)])
    monkeypatch.setattr(background, "problem", lambda target: None)
    started = []
    monkeypatch.setattr(background, "start", lambda target, **kw: started.append(target) or True)
    loaded = []
    monkeypatch.setattr(xla, "load_library", lambda verbose=False: loaded.append(verbose))
    assert xla.ready() is False and [t.stem for t in started] == ["pnex_jax_ffi"] and loaded == []
    monkeypatch.setenv("PNEX_LAUNCHER", "driver")
    assert xla.ready() is False and len(started) == 1
    monkeypatch.setenv("PNEX_LAUNCHER", "auto")
    [target] = started
    target.folder.mkdir(parents=True)
    (target.folder / "libpnex_jax_ffi.so").write_bytes(b"a library")  # what the build process leaves
    build.record_build("libpnex_jax_ffi", target.folder)
    assert xla.ready() is True and loaded == [False] and len(started) == 1


def test_call_layout_table():
    layout = xla.call_layout(accumulate.spec)
    assert layout.operands == ("a", "m") and layout.results == ("hist", "even", "m")
    assert dict(layout.aliases) == {1: 2} and layout.scalars == ("c",)
    assert layout.fills == (1, 0, 4, 0x3FC00000, 0, 0)
    #                    a             m             c             hist          even
    assert layout.table == (0, 0, 1, 4, 1, 2, 1, 4, 3, 0, 0, 8, 2, 0, 1, 4, 2, 1, 1, 4)


@pytest.mark.skipif(build.cuda_include_dir() is None, reason="no CUDA headers (cuda.h) here")
def test_ffi_handler_builds_and_registers_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    path = xla.build_library()
    assert path.exists() and path.name == "libpnex_jax_ffi.so"
    assert xla.build_library() == path  # built once
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
    for symbol in ("PnexJaxInstantiate", "PnexJaxLaunch", "pnex_jax_register", "pnex_jax_add_image", "pnex_jax_archs",
                   "pnex_jax_state_type_id", "pnex_jax_state_type_info", "pnex_jax_set_shared"):
        assert f" T {symbol}" in symbols
    kernel_id = xla.register_kernel(accumulate.definition, ["sm_90", "8.0"])
    assert xla.register_kernel(accumulate.definition, ["sm_90"]) == kernel_id
    lib = xla.load_library()
    archs = (ctypes.c_int64 * 4)()
    assert lib.pnex_jax_archs(kernel_id, archs, 4) == 2 and sorted(archs[:2]) == [80, 90]
    assert lib.pnex_jax_archs(10**9, archs, 4) == -1
    assert lib.pnex_jax_set_shared(kernel_id, 4096) == 0 and lib.pnex_jax_set_shared(10**9, 4096) == -1


def test_ffi_build_failure_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    source = tmp_path / "broken.cpp"
    source.write_text("int broken( {\n")
    with pytest.raises(pnex.KernelCompileError, match="could not build its test library") as info:
        background.build_shared_library("broken", [source], includes=[], what="test library")
    assert "broken.cpp" in info.value.compiler_log
    assert not list(tmp_path.rglob("libbroken.so"))
