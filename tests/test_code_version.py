"""The compile cache's key holds pnex_magic's own code (:mod:`pnex_magic.codeversion`):
a development install whose code changed under the same version number compiles its
kernels again instead of serving the cubins the old code made."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pnex_magic import codeversion
from pnex_magic.codeversion import EXCLUDED, code_files, code_version
from pnex_magic.definition import toolchain_versions

from import_layout import Layout

PACKAGE = Path(codeversion.__file__).resolve().parent

CHILD = textwrap.dedent(
    """
    from numba import cuda
    import pnex_magic as pnex
    from pnex_magic.codeversion import code_version

    @pnex.jit(n_threads="a.numel()")
    def recompiled(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * 3

    report = pnex.inspect(recompiled)  # compiled (or served by the cache) when defined
    print("CACHE", pnex.__file__, report.cache_hit, report.cache_key, code_version())
    """
)


@pytest.mark.slow
def test_changed_codegen_recompiles(tmp_path, pnex_env):
    """A kernel compiled by a copy of the package is compiled again, under another key,
    once the copy's ``tc/bulk.py`` changes an intrinsic's inline PTX (before, the old
    cubin was served: same version number).  With the file back as it was (rewritten:
    new mtime, same bytes) and only the report changed, the copy's code version is the
    first one again, so is the kernel's key (the first entry is a hit)."""
    copy = tmp_path / "site"
    shutil.copytree(PACKAGE, copy / "pnex_magic")  # __pycache__ too (copy2 keeps the mtimes that validate it)
    (tmp_path / "child.py").write_text(CHILD)
    env = dict(pnex_env, PYTHONPATH=str(copy), PNEX_CACHE_DIR=str(tmp_path / "cache"))

    def run(*argv: str) -> list[str]:
        proc = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("CACHE ")]
        _, file, *found = line.split()
        assert Path(file).resolve().is_relative_to(copy.resolve()), file  # the copy ran, not the checkout
        return found

    bulk = copy / "pnex_magic" / "tc" / "bulk.py"
    original = bulk.read_bytes()
    hit, key, version = run("child.py")
    assert hit == "False"
    arrive = b'"mbarrier.arrive.shared::cta.b64 _, [$0];"'
    assert original.count(arrive) == 1
    bulk.write_bytes(original.replace(arrive, b'"mbarrier.arrive.release.cluster.shared::cta.b64 _, [$0];"'))
    hit_changed, key_changed, version_changed = run("child.py")
    assert (hit_changed, key_changed != key, version_changed != version) == ("False", True, True)
    bulk.write_bytes(original)
    report = copy / "pnex_magic" / "report.py"
    report.write_text(report.read_text() + "\n# the report changed: no kernel's code did\n")
    script = "import pnex_magic; from pnex_magic.codeversion import code_version; print('CACHE', pnex_magic.__file__, code_version())"
    assert run("-c", script) == [version]


def test_code_version_is_stable_across_processes(tmp_path, pnex_env):
    """The same tree gives the same version in fresh processes: with no digests kept yet,
    with the ones the first process kept, and in this process."""
    script = "from pnex_magic.codeversion import code_version; print(code_version())"
    env = dict(pnex_env, PYTHONPATH=str(PACKAGE.parent), PNEX_CACHE_DIR=str(tmp_path / "cache"))
    found = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found.append(proc.stdout.strip())
    assert found[0] == found[1] == code_version()
    assert found[0].startswith("source:") and len(found[0]) == len("source:") + 16
    assert list((tmp_path / "cache" / "code").glob("*.json"))  # the digests were kept
    assert f"pnex_magic=0.1.0+{code_version()}" in toolchain_versions()


def _package(root: Path) -> Path:
    package = root / "pnex_magic"
    (package / "tc").mkdir(parents=True)
    (package / "frontends").mkdir()
    (package / "definition.py").write_text("X = 1\n")
    (package / "tc" / "lowering.py").write_text("PTX = 'mbarrier.arrive.shared::cta.b64'\n")
    (package / "frontends" / "magic.py").write_text("M = 1\n")
    (package / "report.py").write_text("R = 1\n")
    return package


@pytest.fixture
def opens(monkeypatch, tmp_path):
    """The files :mod:`~pnex_magic.codeversion` reads, counted; digests kept in a fresh
    cache folder; nothing counts as just changed (``_RACY_NS``)."""
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(codeversion, "_RACY_NS", -10**15)
    read: list[str] = []

    def counting(path, *args, **kwargs):
        read.append(os.path.basename(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(codeversion, "open", counting, raising=False)
    return read


def test_source_digest_covers_contents_not_excluded_files_nor_timestamps(tmp_path, opens):
    package = _package(tmp_path)
    assert code_files(package) == ["definition.py", "tc/lowering.py"]
    first = codeversion._code_version(package)
    assert first.startswith("source:") and sorted(opens) == ["definition.py", "lowering.py"]
    opens.clear()
    assert codeversion._code_version(package) == first and opens == []  # the kept digests: no file read
    lowering = package / "tc" / "lowering.py"
    stat = lowering.stat()
    # Same size, mtime set back: only its ctime (and the content) says it changed.
    lowering.write_text("PTX = 'mbarrier.arrive.release.cluster.b64'"[:stat.st_size - 1] + "\n")
    os.utime(lowering, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert lowering.stat().st_size == stat.st_size and lowering.stat().st_mtime_ns == stat.st_mtime_ns
    changed = codeversion._code_version(package)
    assert changed != first and opens == ["lowering.py"]
    (package / "report.py").write_text("R = 2\n")
    (package / "frontends" / "magic.py").write_text("M = 2\n")
    assert codeversion._code_version(package) == changed
    (package / "tc" / "new_rule.py").write_text("")
    assert codeversion._code_version(package) != changed  # a new module counts, even empty
    (package / "tc" / "new_rule.py").unlink()
    lowering.write_text("PTX = 'mbarrier.arrive.shared::cta.b64'\n")  # back as it was: the first version
    assert codeversion._code_version(package) == first


def test_a_file_just_written_is_read_again(tmp_path, opens, monkeypatch):
    """A digest taken within seconds of the file's last change is not kept (the file may
    change again within its timestamps' granularity)."""
    monkeypatch.setattr(codeversion, "_RACY_NS", 3_000_000_000)
    package = _package(tmp_path)
    first = codeversion._code_version(package)
    opens.clear()
    assert codeversion._code_version(package) == first
    assert sorted(opens) == ["definition.py", "lowering.py"]


def test_with_the_cache_off_no_digest_is_read_or_kept(tmp_path, opens):
    """``use_cache=False`` (a kernel whose options turn the cache off) computes the same
    version from the files alone: the kept digests are not read, and none are written."""
    package = _package(tmp_path)
    cache_folder = tmp_path / "cache"
    off = codeversion._code_version(package, use_cache=False)
    assert sorted(opens) == ["definition.py", "lowering.py"] and not cache_folder.exists()
    opens.clear()
    assert codeversion._code_version(package) == off and len(opens) == 2  # the same version; now kept
    assert len(list((cache_folder / "code").glob("*.json"))) == 2
    opens.clear()
    assert codeversion._code_version(package, use_cache=False) == off
    assert sorted(opens) == ["definition.py", "lowering.py"]  # every file read again: the records were not


NO_CACHE_CHILD = textwrap.dedent(
    """
    import os, sys
    import torch
    from numba import cuda
    import pnex_magic as pnex
    from pnex_magic.define import definition, registered
    from pnex_magic.definition import JitOptions

    def no_cache_k(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * 2 + 1

    with registered(definition(no_cache_k, n_threads="a.numel()", options=JitOptions(use_cache=False))) as op:
        pass
    a = torch.randn(37)
    assert torch.equal(op(a), a * 2 + 1)  # the simulator's typed form: made, not stored
    from pnex_magic.report import build_report
    # compiled where there is a compiler, and disassembled where there is a disassembler: not stored
    report = build_report(op, args=(a,))
    assert report.cache_key or not report.ptx
    print("FOLDER", os.path.exists(sys.argv[1]) and sorted(os.listdir(sys.argv[1])))
    """
)


def test_a_kernel_with_the_cache_off_writes_nothing_into_the_cache_folder(tmp_path, pnex_env):
    """A fresh process whose only kernel turns the cache off (``JitOptions(use_cache=False)``)
    defines, runs (CPU simulator), compiles and reports on it (SASS too): no cache folder is
    made (before, the code version's digests were written into its ``code/``, the SASS
    listing into ``sass/``)."""
    (tmp_path / "child.py").write_text(NO_CACHE_CHILD)
    folder = tmp_path / "cache"
    env = dict(pnex_env, PNEX_CACHE_DIR=str(folder), PNEX_LAUNCHER="driver", PNEX_WARMUP="0")
    proc = subprocess.run([sys.executable, "child.py", str(folder)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("FOLDER ")]
    assert line == "FOLDER False"


def test_an_installed_wheel_is_named_by_its_record(tmp_path, opens):
    package = _package(tmp_path)
    info = tmp_path / "pnex_magic-0.1.0.dist-info"
    info.mkdir()
    record = "pnex_magic/definition.py,sha256=abc,6\npnex_magic/tc/lowering.py,sha256=DEF,40\n"
    (info / "RECORD").write_text(record)
    assert codeversion._code_version(package) == "wheel:" + hashlib.sha256(record.encode()).hexdigest()[:16]
    assert opens == []  # no file of the package read
    (info / "RECORD").write_text(record.replace("DEF", "XYZ"))  # another build of the same version
    assert codeversion._code_version(package) == "wheel:" + hashlib.sha256(
        record.replace("DEF", "XYZ").encode()).hexdigest()[:16]
    # An editable install (PEP 610) is read from its files, whatever its RECORD says.
    (info / "direct_url.json").write_text('{"dir_info": {"editable": true}, "url": "file:///src"}')
    assert codeversion._code_version(package).startswith("source:")
    (info / "direct_url.json").write_text('{"dir_info": {}, "url": "file:///src/pnex_magic-0.1.0.whl"}')
    assert codeversion._code_version(package).startswith("wheel:")
    # A RECORD that does not list this package's files, or two dist-infos: not trusted.
    (tmp_path / "pnex_magic-0.0.9.dist-info").mkdir()
    (tmp_path / "pnex_magic-0.0.9.dist-info" / "RECORD").write_text(record)
    assert codeversion._code_version(package).startswith("source:")
    shutil.rmtree(tmp_path / "pnex_magic-0.0.9.dist-info")
    (info / "RECORD").write_text("other/definition.py,sha256=abc,6\n")
    assert codeversion._code_version(package).startswith("source:")


def test_nothing_that_compiles_or_launches_imports_an_excluded_module():
    """The modules the code version leaves out are the report's, the front ends', the
    tools' and the artifacts': none of them is imported (eagerly or lazily, at any depth)
    by a module that compiles, types, checks, launches, tunes or disassembles a kernel,
    which are all covered.  One import is known to: ``define`` parses a kernel's
    ``flops=`` with the roofline's parser, for the report (the expression is no part of
    the kernel's code)."""
    layout = Layout.of(PACKAGE)
    graph = layout.edges()
    graph["pnex_magic.define"] -= {"pnex_magic.roofline"}
    covered = {"pnex_magic." + f.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
               for f in code_files()} | {"pnex_magic"}
    starts = ["compiler", "definition", "snapshot", "fingerprint", "simtyping", "checking", "tc", "launch", "op",
              "autograd", "adjoint", "multiarch", "sass", "warmup", "numbasetup", "linking", "cubin", "vector", "random"]
    seen: set[str] = set()
    todo = [f"pnex_magic.{s}" for s in starts]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    assert seen <= covered, sorted(seen - covered)
    assert "pnex_magic.tc.lowering" in covered and "pnex_magic.launch.autotune" in covered
    for name in EXCLUDED:  # a renamed module must not leave a stale name behind
        assert (PACKAGE / name).exists(), name
