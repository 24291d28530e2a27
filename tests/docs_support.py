"""Helpers for the documentation's tests (tests/test_docs.py, tests/test_doc_code.py and the
docs part of tests/test_browser.py): building the site once per test process, and reading the
code blocks of its pages.

The site is built with the ``docs`` extra (Sphinx, MyST-NB, furo): :func:`missing` says why it
cannot be where that extra is not installed.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SCREENSHOTS = DOCS / "_static" / "screenshots"

#: The screenshots the docs show, by the name tests/test_browser.py gives them when it takes
#: them: docs file name -> browser-test artifact name.  The browser test writes them into
#: docs/_static/screenshots/ when PNEX_DOCS_SCREENSHOTS=1 (see docs/about.md).
DOC_SCREENSHOTS = {
    "report-cpu-timing.png": "lab-light-6-timing.png",
    "report-gpu-timing.png": "lab-trusted-timed-light-timing.png",
    "report-small-blocks.png": "lab-trusted-timed-light-small-blocks.png",
    "report-untrusted.png": "lab-untrusted-timed-light.png",
    "report-tune-launch.png": "timed-light-launch.png",
    "failing-cell.png": "lab-failing-cell.png",
}


def missing() -> str | None:
    """Why the docs cannot be built here (the ``docs`` extra is missing), or ``None``."""
    for module, package in (("sphinx", "sphinx"), ("myst_nb", "myst-nb"), ("furo", "furo")):
        try:
            __import__(module)
        except ImportError:
            return f"{package} is not installed: the docs extra (pip install -e '.[docs]')"
    return None


@dataclass(frozen=True)
class Build:
    html: Path  # the built site's root folder
    seconds: float
    output: str  # what sphinx-build printed


@functools.lru_cache(maxsize=1)
def build_docs() -> Build:
    """Build the site from scratch into a temporary folder, warnings as errors (``-W``), once
    per test process.  Raises ``AssertionError`` with Sphinx's output when the build fails."""
    out = Path(tempfile.mkdtemp(prefix="pnex-docs-"))
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
           "-d", str(out / "doctrees"), str(DOCS), str(out / "html")]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"sphinx-build -W failed ({done.returncode}):\n{output[-6000:]}"
    return Build(out / "html", seconds, output)


# --- code blocks -----------------------------------------------------------------------------------

#: The languages of the blocks that run: Python, and IPython (cells with magics).
RUN_LANGUAGES = ("python", "ipython", "py", "python3")
_FENCE = re.compile(r"^(?P<indent>[ ]{0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                    re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    page: str  # e.g. "docs/kernels.md"
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    classes: tuple[str, ...] = ()  # a ``{code-block}`` directive's ``:class:`` option

    @property
    def gpu(self) -> bool:
        """A block that needs a GPU: its first line is ``# gpu`` (``# gpu: why``), or, where a
        comment cannot come first (a ``%%pnex`` cell), it is a ``{code-block}`` with
        ``:class: gpu``."""
        first = self.code.lstrip("\n").split("\n", 1)[0].strip().lower()
        return first == "# gpu" or first.startswith("# gpu:") or "gpu" in self.classes

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.language}{', gpu' if self.gpu else ''})"


def code_blocks(path: Path) -> list[Block]:
    """Every fenced code block of a markdown page, in order (directives such as
    ``{pnex-results}`` are blocks too; only :data:`RUN_LANGUAGES` run)."""
    text = path.read_text()
    blocks = []
    for m in _FENCE.finditer(text):
        info = m.group("info").split()
        language, body, classes = (info[0] if info else ""), m.group("body"), ()
        if language in ("{code-block}", "{code}", "{code-cell}") and len(info) > 1:
            language = info[1]
            options = re.match(r"((?::[\w-]+:.*\n)*)", body).group(1)
            body = body[len(options):]
            found = re.search(r"^:class:(.*)$", options, re.MULTILINE)
            classes = tuple(found.group(1).split()) if found else ()
        line = text.count("\n", 0, m.start()) + 1
        page = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        blocks.append(Block(page, line, language, body, classes))
    return blocks


def pages() -> list[Path]:
    """The pages whose code runs: the docs' markdown pages and the README."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
