"""The C++ launcher's one-time build, without a GPU: a failed build is recorded once with
the compiler's output and not tried again until its toolchain or inputs change, a
killed build's leftovers are cleared, a build is imported without torch's build
machinery, and the launcher's spec for an op matches the kernel's parameters."""

import ctypes
import re
import subprocess
from pathlib import Path

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.errors import KernelCompileError
from pnex_magic.expressions import OPCODES
from pnex_magic.launch import background, build, native
from pnex_magic.launch.description import describe_launch


BROKEN = "int broken( {\n"


def _library_build(tmp_path, text: str, stem: str = "pnex_probe_lib") -> build.Build:
    source = tmp_path / f"{stem}.cpp"
    source.write_text(text)
    return build.Build(stem, "library", "probe library", (str(source),))


def _sections(target: build.Build) -> int:
    """How many times a build of ``target`` ran (one section of its log each)."""
    log = background.log_path(target)
    return log.read_text().count("pnex: building the") if log.exists() else 0


def test_a_failed_build_is_recorded_once_with_the_compilers_output(monkeypatch, tmp_path):
    """A failed build leaves nothing that counts as built, the compiler's output in a log
    and a record that keeps every process from trying again until the toolchain (or the
    build's inputs) change."""
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))
    target = _library_build(tmp_path, BROKEN)
    assert background.state(target) == "none"
    assert background.run(target) == 1
    assert background.state(target) == "failed" and target.built() is None
    record = background.failure(target)
    assert record["log"] == str(background.log_path(target)) and "expected" in record["error"]
    assert "pnex_probe_lib.cpp" in background.log_path(target).read_text()  # the compiler's own message
    assert not [p for p in target.folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    assert background.start(target) is False  # not tried again
    with pytest.raises(KernelCompileError, match=r"could not build its probe library.*remove .*failed\.json") as info:
        background.build_now(target)
    assert "pnex_probe_lib.cpp" in info.value.compiler_log
    assert _sections(target) == 1
    # Another compiler (installed, upgraded): tried again, once.
    tools = build.toolchain()
    monkeypatch.setattr(background, "toolchain", lambda: {**tools, "compiler_mtime": 1})
    assert background.failure(target) is None and background.state(target) == "none"
    assert background.run(target) == 1 and _sections(target) == 2
    # Fixed sources are another build (another key), which builds.
    fixed = _library_build(tmp_path, 'extern "C" __attribute__((visibility("default"))) int probe() { return 7; }\n')
    assert fixed.key != target.key
    library = background.build_now(fixed)
    assert library == fixed.built() and ctypes.CDLL(str(library)).probe() == 7


def test_missing_cuda_headers_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_targets", {})
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
    assert d["shared"] == [0]  # bytes of dynamic shared memory per Tune variant


def test_a_killed_builds_folder_is_removed_once_nothing_works_in_it(monkeypatch, tmp_path):
    """A killed build's compilers outlive it, working in its temporary folder: the next
    build of the same key leaves that folder alone while they run, and removes it after."""
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))
    target = _library_build(tmp_path, "int probe;\n")
    left = target.folder.parent / f".{target.folder.name}.tmp-999999999"
    left.mkdir(parents=True)
    assert background._builders_left_running(left) == []
    orphan = subprocess.Popen(["sleep", "30"], cwd=left)
    try:
        assert background._builders_left_running(left) == [orphan.pid]
        assert background.run(target) == 0 and target.built() is not None
        assert left.exists()  # something still works in it
    finally:
        orphan.kill()
        orphan.wait()
    again = _library_build(tmp_path, "int probe2;\n", stem="pnex_probe_lib")
    moved = again.folder.parent / f".{again.folder.name}.tmp-999999998"
    moved.mkdir(parents=True)
    assert background.run(again) == 0
    assert not moved.exists()  # nothing works in it: removed


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
from pnex_magic.launch import background
module = background.build_extension("pnex_tiny", [Path(sys.argv[1])], includes=[], what="test extension")
print(module.__name__, "torch.utils.cpp_extension" in sys.modules, "setuptools" in sys.modules)
"""


def test_a_built_extension_is_imported_without_cpp_extension(tmp_path, pnex_env):
    """The build runs in a process of its own, and every process imports the recorded
    build straight from its folder: neither ``torch.utils.cpp_extension`` nor setuptools
    is imported there (0.4 s on the GPU image)."""
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
    assert "building the test extension" in runs[0].stderr and "building" not in runs[1].stderr
    assert first[1:] == second[1:] == ["False", "False"], (first, second)


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
    shared = {"cuda_driver.h", "cooperative.h", "shared_memory.h"}  # headers the XLA handler includes too
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


def test_the_autotune_unit_declares_what_torch_declares():
    """launcher_autotune.cpp declares torch's THPVariable_Wrap itself instead of including
    python_variable.h (13 s of the build on its own): torch must still declare it so."""
    ours = re.search(r"^TORCH_PYTHON_API PyObject\* THPVariable_Wrap\(const at::TensorBase& var\);$",
                     (build.CSRC / "launcher_autotune.cpp").read_text(), re.M)
    header = Path(torch.__file__).parent / "include/torch/csrc/autograd/python_variable.h"
    assert ours is not None and ours.group(0) in header.read_text()
