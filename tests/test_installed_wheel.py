"""pnex_magic as users get it: built into a wheel (``python -m build --wheel``), installed
(not editable) into a new virtual environment, and run from there, outside the source
tree: the README's quickstart (a kernel on CPU tensors through the simulator), the
``%%pnex`` magic in an IPython shell (docs/magic.md's copy cell), and the C++ sources
compiled from the installed package.  CI installs the project editable, which reads
every file from the checkout; here a file left out of the package
(``[tool.setuptools.package-data]``, a folder without ``__init__.py``) fails.

The new environment gets pnex_magic from the wheel and its dependencies from this
environment: its site-packages holds a link to each of this environment's packages
(found there as installed ones are: by imports, ``importlib.metadata``, cuda.pathfinder's
search for the NVIDIA libraries, ``.pth`` files such as numba-cuda's redirection of
``numba.cuda``), but none to the editable install of pnex_magic.  Installing them
afresh instead (``pip install torch==2.13.0``, then the wheel with its ``cu13`` extra:
1.8 GB) took 3 min 40 s on the 2-core machine; linking them takes a second.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _package_files() -> list[str]:
    """The files of the package in the checkout (tracked, or new and not ignored),
    relative to ``pnex_magic/``."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", "pnex_magic"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    return sorted(str(Path(f).relative_to("pnex_magic")) for f in listed if f and (REPO / f).is_file())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout's files (a build writes ``build/`` and
    ``*.egg-info`` into the folder it builds)."""
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    [found] = dist.glob("pnex_magic-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A new virtual environment with the wheel installed (not editable); its Python.  (pip
    runs from this environment, where it sees the editable install: --ignore-installed.)"""
    folder = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=300)
    python = folder / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                           "--ignore-installed", "--no-index", str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    installed = {p.name for p in purelib.iterdir()}
    assert "pnex_magic" in installed, installed
    for outer in dict.fromkeys(Path(p) for p in (*site.getsitepackages(), sysconfig.get_paths()["purelib"])):
        if not outer.is_dir() or outer.resolve() == purelib.resolve():
            continue
        for entry in outer.iterdir():
            own = entry.name.lower().replace("-", "_").startswith(("pnex_magic", "__editable__"))
            if not own and entry.name != "__pycache__" and entry.name not in installed:
                (purelib / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
                installed.add(entry.name)
    return python


def _run(python: Path, args: list[str], cwd: Path, cache: Path, timeout: float = 600) -> str:
    """Run the new environment's Python from ``cwd`` (outside the checkout), with no
    ``PYTHONPATH`` (which may name the checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONOPTIMIZE")}
    env.update(PNEX_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
    done = subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout


def _readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)


def _magic_cell() -> str | None:
    """The documentation's first ``%%pnex ... --args (x,)`` cell (docs/magic.md's copy
    kernel; the README names the magic inline and links there)."""
    for page in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))):
        for block in re.findall(r"```(?:python|ipython)\n(.*?)```", page.read_text(), re.DOTALL):
            if block.startswith("%%pnex") and "--args (x,)" in block:
                return block
    return None


def _installed_from(output: str, python: Path) -> Path:
    """The pnex_magic package folder a run printed (``PNEX_MODULE <path>``), checked to be
    the new environment's."""
    [line] = [line for line in output.splitlines() if line.startswith("PNEX_MODULE ")]
    module = Path(line.split(" ", 1)[1])
    assert module.is_relative_to(python.parent.parent) and not module.is_relative_to(REPO), module
    return module.parent


def test_the_quickstart_runs_from_the_installed_wheel(venv, tmp_path):
    quickstart = next((b for b in _readme_blocks() if "@pnex.jit" in b), None)
    assert quickstart is not None, "README.md has no ```python block with @pnex.jit (the quickstart)"
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart + "\nimport pnex_magic\nprint('PNEX_MODULE', pnex_magic.__file__)\n"
                      "from pnex_magic.codeversion import code_version\nprint('PNEX_CODE', code_version())\n")
    out = _run(venv, [str(script)], tmp_path, tmp_path / "cache")
    _installed_from(out, venv)
    assert "schema" in out.lower() and "ptx" in out.lower(), out[-2000:]  # pnex.inspect's summary
    # The cache keys name the installed code by the wheel's RECORD (no file of the package read).
    [code] = [line.split()[1] for line in out.splitlines() if line.startswith("PNEX_CODE ")]
    assert re.fullmatch(r"wheel:[0-9a-f]{16}", code), code


MAGIC = '''
import json, pnex_magic, torch
get_ipython().run_line_magic("load_ext", "pnex_magic")
x = torch.randn(1000)
line, cell = {cell!r}.split("\\n", 1)
get_ipython().run_cell_magic("pnex", line.removeprefix("%%pnex").strip(), cell)
name = report.bound_name
op = get_ipython().user_ns[name]
html = report.to_html()
check = report.timing.correctness
tabs = [t for t in ("Signature", "Launch", "PTX", "SASS", "Resources", "Timing") if t in html]
print("RESULT " + json.dumps({{
    "same": torch.equal(op(x), x), "check": check.ok, "where": check.where, "name": name, "style": "<style" in html,
    "tabs": tabs,
}}))
print("PNEX_MODULE", pnex_magic.__file__)
'''


def test_the_magic_runs_in_ipython_from_the_installed_wheel(venv, tmp_path):
    cell = _magic_cell()
    assert cell is not None, "neither README.md nor docs/*.md has a block starting with %%pnex ... --args (x,)"
    script = tmp_path / "magic.ipy"
    script.write_text(MAGIC.format(cell=cell))
    ipython = ["-m", "IPython", "--no-banner", "--colors=nocolor", "--HistoryManager.enabled=False", str(script)]
    out = _run(venv, ipython, tmp_path, tmp_path / "cache")
    _installed_from(out, venv)
    record = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert record["same"] and record["check"] is True and "CUDA simulator" in record["where"], record
    assert record["style"] and record["tabs"] == ["Signature", "Launch", "PTX", "SASS", "Resources", "Timing"], record


CONTENTS = """
import json, pathlib, pnex_magic
from pnex_magic.launch import build, native, xla
root = pathlib.Path(pnex_magic.__file__).parent
files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
read = [str(p) for p in (*native.SOURCES, *native.HEADERS, xla.SOURCE, *xla.HEADERS)]
try:
    built = str(xla.build_library())  # the XLA FFI handler, compiled from the installed C++ sources
except Exception as exc:
    built = f"{type(exc).__name__}: {str(exc)[:300]}"
print("RESULT " + json.dumps({"files": files, "missing": [p for p in read if not pathlib.Path(p).is_file()],
                             "outside": [p for p in read if not pathlib.Path(p).is_relative_to(root)],
                             "built": built}))
print("PNEX_MODULE", pnex_magic.__file__)
"""


def test_the_installed_package_holds_every_file_and_its_cpp_sources_build(venv, tmp_path):
    """Every file of the package in the checkout is in the installed one (the C++ sources
    and headers, py.typed, every module), and the C++ sources the launchers build from
    are read from there: the XLA FFI handler compiles from them."""
    pytest.importorskip("jax")
    out = _run(venv, ["-c", CONTENTS], tmp_path, tmp_path / "cache")
    root = _installed_from(out, venv)
    record = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    missing = sorted(set(_package_files()) - set(record["files"]))
    assert missing == [], f"files of pnex_magic/ that the wheel does not install: {missing}"
    assert record["missing"] == [] and record["outside"] == [], record
    assert Path(record["built"]).is_file() and not Path(record["built"]).is_relative_to(root), record["built"]
