"""``.ci/run`` runs the README's test command verbatim, and that command installs the
``sass`` extra (so the real SASS path is tested, not skipped) and the ``docs`` extra (so the
documentation is built, tests/test_docs.py, not skipped), and prints skip reasons."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("Tests (CPU"):]
    return re.search(r"```bash\n(.+?)\n```", section, re.DOTALL).group(1).strip()


def test_ci_runs_the_readme_test_command_verbatim():
    command = _readme_test_command()
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in lines, f".ci/run does not run the README's test command:\n{command}"


def test_the_test_command_installs_the_sass_and_docs_extras_and_prints_skip_reasons():
    command = _readme_test_command()
    extras = re.search(r'pip install -e "\.\[([^\]]*)\]"', command).group(1).split(",")
    assert {"test", "sass", "docs"} <= set(extras), command
    assert re.search(r"python -m pytest .*-rs\b", command), command
