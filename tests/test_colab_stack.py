"""Colab's preinstalled stack: installing pnex_magic must not move it.

A Colab GPU runtime (Python 3.13) ships, among others, the versions below
(googlecolab/backend-info, pip-freeze.gpu.txt of 2026-08-19; unchanged for
IPython, ipywidgets and ipykernel since at least 2026-01).  ``%pip install
"pnex_magic[cu12]"`` there keeps every one of them; it upgrades only numba-cuda
(0.22 -> 0.30+, which pnex needs), cuda-core (which numba-cuda 0.30 needs), and
moves nvidia-cuda-cccl-cu12 from 12.9.27 to the 12.8.90 of Colab's own
cuda-toolkit 12.8.1 (numba-cuda[cu12] asks for cuda-toolkit[cccl]; header files).

The second test runs the magic's tests under Colab's IPython 7 and ipywidgets 7
(installed with pip into a folder put first on ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]

COLAB_GPU = {
    "torch": "2.11.0",
    "numpy": "2.1.3",
    "ipython": "7.34.0",
    "ipywidgets": "7.7.1",
    "ipykernel": "6.17.1",
    "jupyter-client": "7.4.9",
    "pygments": "2.21.0",
    "numba": "0.61.2",
    "cuda-bindings": "12.9.7",
    "cuda-pathfinder": "1.6.0",
    "nvidia-nvjitlink-cu12": "12.8.93",
}
# What IPython 7.34 needs beyond what the test environment has.
_OVERLAY = [
    "ipython==7.34.0", "ipywidgets==7.7.1", "widgetsnbextension==3.6.10", "jupyterlab_widgets==1.1.11",
    "ipykernel==6.17.1", "jupyter_client==7.4.9", "numpy==2.1.3", "backcall", "pickleshare", "decorator",
    "prompt_toolkit<3.1", "ipython_genutils",
]


def _requirements(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return [Requirement(r) for r in reqs]


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def test_pins_admit_colabs_preinstalled_versions():
    checked = 0
    for req in _requirements() + _requirements("cu12"):
        version = COLAB_GPU.get(_norm(req.name))
        if version is not None:
            assert req.specifier.contains(version, prereleases=True), f"{req} would replace Colab's {version}"
            checked += 1
    assert checked >= 5
    # numba-cuda is upgraded (Colab has 0.22): what it asks for in turn must fit Colab too.
    for text in metadata.requires("numba-cuda") or []:
        req = Requirement(text)
        version = COLAB_GPU.get(_norm(req.name))
        in_cu12 = req.marker is None or req.marker.evaluate({"extra": "cu12"})
        if version is not None and in_cu12:
            assert req.specifier.contains(version, prereleases=True), f"numba-cuda: {req} vs Colab's {version}"


@pytest.mark.slow
def test_magic_under_colabs_ipython7_and_ipywidgets7(pip_target):
    overlay = pip_target("colab-stack", *_OVERLAY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(overlay), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    versions = subprocess.run(
        [sys.executable, "-c", "import IPython, ipywidgets, numpy; print(IPython.__version__, ipywidgets.__version__, "
                               "numpy.__version__)"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert versions.stdout.split() == ["7.34.0", "7.7.1", "2.1.3"], versions.stderr
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::UserWarning",
         *(str(path) for path in sorted((ROOT / "tests").glob("test_magic_*.py")))],
        env=env, capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    tail = done.stdout[-3000:]
    assert done.returncode == 0, tail + done.stderr[-2000:]
    assert " passed" in tail and " failed" not in tail, tail
