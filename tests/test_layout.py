"""The package's house stays in order (issue 29): one room per concern, imports that
point down, no room too big to read in one sitting.

The graph is drawn from the source (``tests/import_layout.py``: every ``import`` of a
``pnex_magic`` module, at module level or in a function, ``if TYPE_CHECKING:`` blocks
left out), and:

* no group of modules imports each other, lazy imports counted;
* at most 3 lazy imports run back up, to a module that is not below the importer in
  the floors the eager imports draw, and each says why on its line or the line
  above (a lazy import is there to keep the compile-cache hit path free of Numba's
  compiler and what only a compile needs).  The roof is not counted: the package
  facade (``pnex_magic/__init__.py``, whose exports import the front ends when a
  name is first read) and the child processes' entry scripts (``__main__.py``,
  ``_sanitize_child.py``, ``_profile_child.py``), which import the package as a user does;
* no module of the package is over 600 lines, and no file of the tests (``tests/*.py``) or
  the benchmarks (``benchmarks/**/*.py``) either: a long test file is split by theme, its
  shared kernels and fixtures in a small helper module beside it (``tests/core_kernels.py``),
  a long benchmark script into a thin command line and a package (``benchmarks/workloads_lib/``).

``python tests/import_layout.py [package_dir]`` prints the same figures for any tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from import_layout import Import, Layout

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pnex_magic"
MAX_UP_ARROWS = 3
MAX_LINES = 600
#: the other Python files held to MAX_LINES, as globs under the repository
OTHER_FILES = ("tests/*.py", "benchmarks/**/*.py")


@pytest.fixture(scope="module")
def layout() -> Layout:
    found = Layout.of(PACKAGE)
    print("\nlayout of pnex_magic:", {k: v for k, v in found.figures().items() if k != "up_arrow_statements"})
    return found


def test_no_import_cycle(layout):
    assert layout.cycles() == []


def test_few_lazy_imports_run_back_up_and_each_says_why(layout):
    up = layout.up_arrows()
    pairs = sorted({(i.source, i.target) for i in up})
    assert len(pairs) <= MAX_UP_ARROWS, pairs
    silent = [f"{i.source} -> {i.target} (line {i.line})" for i in up if not layout.commented(i)]
    assert silent == []


def test_no_module_over_600_lines(layout):
    assert sorted((n, m) for m, n in layout.sizes().items() if n > MAX_LINES) == []


def too_long(root: Path, patterns=OTHER_FILES, limit: int = MAX_LINES) -> list[str]:
    """``"path: N lines"`` for each file under ``root`` matching ``patterns`` with more than
    ``limit`` lines, longest first."""
    found = {p for pattern in patterns for p in root.glob(pattern) if p.is_file()}
    sizes = {p: len(p.read_text().splitlines()) for p in found}
    return [f"{p.relative_to(root)}: {n} lines" for p, n in sorted(sizes.items(), key=lambda pn: (-pn[1], pn[0]))
            if n > limit]


def test_no_test_or_benchmark_file_over_600_lines():
    checked = {p.relative_to(REPO).as_posix() for pattern in OTHER_FILES for p in REPO.glob(pattern)}
    assert {"tests/test_layout.py", "tests/conftest.py", "benchmarks/workloads.py",
            "benchmarks/workloads_lib/lltm.py"} <= checked  # the globs reach the files and the packages
    long = too_long(REPO)
    assert long == [], (f"over {MAX_LINES} lines: " + "; ".join(long)
                        + " (split a test file by theme, a benchmark into a script and a package)")


def test_the_length_check_names_each_long_file_and_its_length(tmp_path):
    for name, n in {"tests/test_a.py": 601, "tests/test_b.py": 600, "tests/sub/test_c.py": 900,
                    "benchmarks/run.py": 700, "benchmarks/run_lib/part.py": 650, "benchmarks/notes.txt": 999}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * n)
    assert too_long(tmp_path) == ["benchmarks/run.py: 700 lines", "benchmarks/run_lib/part.py: 650 lines",
                                  "tests/test_a.py: 601 lines"]


# --------------------------------------------------------------------------- the graph itself


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_graph_sees_lazy_relative_absolute_and_type_checking_imports(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "low.py": "X = 1\n",
        "mid.py": "from . import low\n",
        "high.py": (
            "from typing import TYPE_CHECKING\n"
            "import pkg.mid\n"
            "if TYPE_CHECKING:\n"
            "    from .top import T\n"
            "def f():\n"
            "    from .sub.leaf import Y  # why it is lazy\n"
        ),
        "sub/__init__.py": "from .leaf import Y\n",
        "sub/leaf.py": "Y = 2\n",
        "top.py": "from .high import f\n",
    })
    layout = Layout.of(root)
    assert layout.edges(lazy=False)["pkg.high"] == {"pkg.mid"}
    assert layout.edges(lazy=True)["pkg.high"] == {"pkg.sub.leaf", "pkg.sub"}  # the sub-package's __init__ runs too
    assert "pkg.top" not in layout.edges()["pkg.high"]  # TYPE_CHECKING: never runs
    floors = layout.floors()
    assert (floors["pkg.low"], floors["pkg.mid"], floors["pkg.high"], floors["pkg.top"]) == (0, 1, 2, 3)
    assert layout.up_arrows() == []  # pkg.sub (floor 1) is below pkg.high (floor 2)
    assert layout.cycles() == []


def test_the_graph_finds_a_cycle_through_a_lazy_import_and_an_uncommented_up_arrow(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "def __getattr__(name):\n    from .b import B\n    return B\n",
        "a.py": "def f():\n    from .b import B\n    return B\n",
        "b.py": "from .a import f\nB = 1\n",
        "c.py": "def g():\n    # keeps the cold path light\n    from . import b\n",
    })
    layout = Layout.of(root)
    assert layout.cycles() == [["pkg.a", "pkg.b"]]
    up = layout.up_arrows()  # the facade's lazy export is the roof's
    assert [(i.source, i.target) for i in up] == [("pkg.a", "pkg.b"), ("pkg.c", "pkg.b")]
    assert [layout.commented(i) for i in up] == [False, True]
    assert isinstance(up[0], Import) and up[0].line == 2
