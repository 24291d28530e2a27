"""The C++ launcher's one-time build, without a GPU: a lock left by a killed build is
cleared, a failed build raises the compiler's message and is not remembered, and the
launcher's spec for an op matches the kernel's parameters."""

import subprocess

import pytest
import torch
import torch.utils.cpp_extension
from numba import cuda

import pnex_magic as pnex
from pnex_magic.errors import KernelCompileError
from pnex_magic.expressions import OPCODES
from pnex_magic.launch import build, native
from pnex_magic.launch.description import describe_launch


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(build, "cuda_include_dir", lambda: str(tmp_path))
    (tmp_path / "crt").mkdir()
    (tmp_path / "crt" / "host_config.h").write_text("")
    calls = []

    def load(name, sources, build_directory, **kwargs):
        calls.append(build_directory)
        assert not (tmp_path / "launcher").joinpath(name.removeprefix("pnex_launcher_"), "lock").exists()
        raise RuntimeError("Error building extension 'pnex_launcher': launcher.cpp:1: error: expected ';'")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    return tmp_path, calls


def test_stale_lock_is_removed_and_failed_build_is_not_cached(fake_build):
    tmp_path, calls = fake_build
    key = native._build_key(str(tmp_path))
    build_dir = tmp_path / "launcher" / key
    build_dir.mkdir(parents=True)
    (build_dir / "lock").write_text("")  # what a killed torch build leaves behind
    with pytest.raises(KernelCompileError, match=r"could not build its C\+\+ launcher.*expected ';'"):
        native.load_launcher()
    assert native._module is None
    with pytest.raises(KernelCompileError):  # tried again, not served from memory
        native.load_launcher()
    assert len(calls) == 2


def test_missing_cuda_headers_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(build, "cuda_include_dir", lambda: None)
    with pytest.raises(KernelCompileError, match="needs the CUDA headers"):
        native.load_launcher()
    (tmp_path / "cuda.h").write_text("")  # cuda.h, but no crt/ anywhere (CUDA 13 wheels without nvidia-cuda-crt)
    monkeypatch.setattr(build, "cuda_include_dir", lambda: str(tmp_path))
    monkeypatch.setattr(build, "_header_dir", lambda component, header: None)
    with pytest.raises(KernelCompileError, match=r"crt/ folder, which .* lacks.*nvidia-cuda-crt"):
        native.load_launcher()


def test_crt_headers_found_in_another_folder(monkeypatch, tmp_path):
    """CUDA 12 wheels: cuda.h in nvidia/cuda_runtime/include, crt/ in nvidia/cuda_nvcc/include."""
    runtime, nvcc = tmp_path / "cuda_runtime" / "include", tmp_path / "cuda_nvcc" / "include"
    (runtime).mkdir(parents=True)
    (runtime / "cuda.h").write_text("")
    (nvcc / "crt").mkdir(parents=True)
    (nvcc / "crt" / "host_config.h").write_text("")
    monkeypatch.setattr(build, "cuda_include_dir", lambda: str(runtime))
    monkeypatch.setattr(build, "_header_dir", lambda component, header: str(nvcc) if component == "nvcc" else None)
    assert build.cuda_include_dirs() == [str(runtime), str(nvcc)]
    (runtime / "crt").mkdir()
    (runtime / "crt" / "host_config.h").write_text("")
    assert build.cuda_include_dirs() == [str(runtime)]


def test_spec_for_the_launcher():
    @pnex.jit(n_threads=("out.size(1)", "out.size(0) // 2 + 1"), threads_per_block=(32, 8))
    def kern(
        a: pnex.In("f16", (None, None)),
        s: int,
        skip: pnex.Unused,
        m: pnex.InMut("i32", ("a.size(0)",)),
        out: pnex.Out("f32", ("a.size(0) * s", 3), init=1.5),
    ):
        x, y = cuda.grid(2)
        if y < out.shape[0] and x < out.shape[1]:
            out[y, x] = a[0, 0]

    d = describe_launch(kern.definition.spec)
    assert [p["kind"] for p in d["params"]] == [0, 3, 4, 1, 2]
    assert d["arguments"] == [0, 1, 3] and d["outputs"] == [4]
    out = d["params"][4]
    assert out["dtype"] == "float32" and out["init"] == 1.5 and out["ndim"] == 2
    size, mul = OPCODES["size"], OPCODES["*"]
    assert out["shape"][0] == [(size, 0, 0), (OPCODES["scalar"], 1, 0), (mul, 0, 0)]
    assert out["shape"][1] == [(OPCODES["const"], 3, 0)]
    assert d["params"][0]["shape"] == [None, None]
    assert d["n_threads"][1] == [(size, 4, 0), (OPCODES["const"], 2, 0), (OPCODES["//"], 0, 0), (OPCODES["const"], 1, 0), (OPCODES["+"], 0, 0)]
    assert d["block"] == [32, 8, 1]


def test_a_build_left_running_by_a_killed_process_is_waited_for(tmp_path, capsys):
    """A killed build's ninja and compiler outlive it, working in the build folder: the
    next build waits for them instead of writing the same files beside them."""
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    assert build._builders_left_running(build_dir) == []
    orphan = subprocess.Popen(["sleep", "1"], cwd=build_dir)
    try:
        assert build._builders_left_running(build_dir) == [orphan.pid]
        build._wait_for_builders_left_running(build_dir, "probe")
        assert orphan.poll() is not None  # it returned only once the process had ended
    finally:
        orphan.kill()
        orphan.wait()
    assert "waiting for the probe build that a killed process left running" in capsys.readouterr().err


TINY_EXTENSION = r"""
#include <Python.h>
#define PNEX_STR2(x) #x
#define PNEX_STR(x) PNEX_STR2(x)
#define PNEX_CAT2(a, b) a##b
#define PNEX_CAT(a, b) PNEX_CAT2(a, b)
static PyModuleDef tiny = {PyModuleDef_HEAD_INIT, PNEX_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
PyMODINIT_FUNC PNEX_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&tiny); }
"""

IMPORT_BUILT = """
import sys
from pathlib import Path
from pnex_magic.launch import build
module = build.build_extension("pnex_tiny", [Path(sys.argv[1])], includes=[], what="test extension")
print(module.__name__, "torch.utils.cpp_extension" in sys.modules, "setuptools" in sys.modules)
"""


def test_a_built_extension_is_imported_without_cpp_extension(tmp_path, pnex_env):
    """The second process imports the recorded build straight from its folder: neither
    ``torch.utils.cpp_extension`` nor setuptools is imported (0.4 s on the GPU image)."""
    import shutil

    if shutil.which("c++") is None or shutil.which("ninja") is None and not _has_ninja_module():
        pytest.skip("no host C++ compiler or ninja to build a test extension")
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_EXTENSION)
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"))
    runs = [subprocess.run([__import__("sys").executable, "-c", IMPORT_BUILT, str(source)], env=env,
                           capture_output=True, text=True, timeout=600) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
    first, second = (run.stdout.split() for run in runs)
    assert first[0] == second[0] and first[0].startswith("pnex_tiny_")
    assert first[1] == "True"  # the build used it
    assert second[1:] == ["False", "False"], second


def _has_ninja_module() -> bool:
    try:
        import ninja  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_build_key_covers_every_launcher_source_and_header(monkeypatch, tmp_path):
    """The launcher is several translation units and headers (csrc/launcher*): each is
    built, and a change to any one of them makes a new build."""
    own = {p.name for p in build.CSRC.glob("launcher*")}
    shared = {"cuda_driver.h", "cooperative.h"}  # headers the XLA handler includes too
    assert own == {p.name for p in (*native.SOURCES, *native.HEADERS)} - shared
    assert all(p.suffix == ".cpp" for p in native.SOURCES) and shared <= {p.name for p in native.HEADERS}
    copies = {}
    for path in (*native.SOURCES, *native.HEADERS):
        copies[path.name] = tmp_path / path.name
        copies[path.name].write_bytes(path.read_bytes())
    monkeypatch.setattr(native, "SOURCES", tuple(copies[p.name] for p in native.SOURCES))
    monkeypatch.setattr(native, "HEADERS", tuple(copies[p.name] for p in native.HEADERS))
    keys = {native._build_key("/include")}
    for copy in copies.values():
        copy.write_text(copy.read_text() + "\n// changed\n")
        keys.add(native._build_key("/include"))
    assert len(keys) == len(copies) + 1
