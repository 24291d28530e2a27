"""Shared test set-up for pnex_magic.

* The whole session compiles into a fresh, private cache directory
  (``$PNEX_CACHE_DIR``), set here before pnex compiles anything, unless the
  caller already chose one.  Subprocesses started by tests inherit it, and
  ``PNEX_LAUNCHER=native`` (unless set): GPU tests get the C++ launcher from their
  first definition on.
* ``@pytest.mark.gpu`` tests are skipped where ``torch.cuda.is_available()`` is
  False (or raises).  With ``PNEX_EXPECT_GPU=1`` (set by ``benchmarks/gpu_tests.sh``
  on the GPU machine) they fail instead, each with what CUDA said: a broken CUDA
  set-up there must not pass as "no GPU".
* Fixtures: ``fresh_cache`` (an empty cache directory, as ``$PNEX_CACHE_DIR``,
  and zeroed hit/miss counters for one test; yields its path), ``gpu_cache`` (the
  same for GPU tests, sharing the session's C++ launcher build, autotuning on),
  ``launcher`` (each GPU test once per GPU launcher, C++ and Python driver), ``pnex_env``
  (an environment for subprocesses that import pnex_magic: the session's cache,
  no inherited ``PYTHONOPTIMIZE``) and ``pip_target`` (pip-installs wheels into a
  folder for ``PYTHONPATH``: other versions beside this environment's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
import warnings

import pytest

_SESSION_CACHE: str | None = None
if not os.environ.get("PNEX_CACHE_DIR"):
    _SESSION_CACHE = tempfile.mkdtemp(prefix="pnex-test-cache-")
    os.environ["PNEX_CACHE_DIR"] = _SESSION_CACHE
# The GPU tests expect the C++ launcher from an op's definition on, as a process that
# sets PNEX_LAUNCHER=native gets it (built in the foreground the first time); the tests
# of the first run in an environment (tests/test_first_run.py) set PNEX_LAUNCHER=auto.
os.environ.setdefault("PNEX_LAUNCHER", "native")


def pytest_sessionfinish(session, exitstatus):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    folder = getattr(config, "pnex_browser_artifacts", None)
    if folder is not None:
        terminalreporter.write_line(f"browser test screenshots: {folder}")


def _no_gpu() -> str | None:
    """None where torch can use a GPU, else why not (what CUDA raised or warned)."""
    try:
        import torch

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if torch.cuda.is_available():
                return None
    except Exception as exc:  # a broken CUDA set-up: no GPU, unless one is expected
        return f"torch.cuda.is_available() raised {type(exc).__name__}: {exc}"
    said = "; ".join(str(w.message) for w in caught)
    return "torch.cuda.is_available() is False" + (f" ({said})" if said else "")


def _gpu_expected() -> bool:
    return os.environ.get("PNEX_EXPECT_GPU", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    why = _no_gpu()
    if why is None:
        return
    if _gpu_expected():
        config.pnex_no_gpu = why  # every gpu test fails with it (pytest_runtest_setup)
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    why = getattr(item.config, "pnex_no_gpu", None)
    if why is not None and "gpu" in item.keywords:
        pytest.fail(f"PNEX_EXPECT_GPU=1 but no usable GPU: {why}", pytrace=False)


@pytest.fixture
def python_frozen():
    """The freeze count that means "nothing frozen" (:func:`gc.get_freeze_count`), with
    whatever was frozen before the test unfrozen: 0 on Python 3.11 and 3.13; on 3.12 a full
    collection moves Python's own immortal objects (375 at start) to the permanent
    generation, so the count goes back to that after each one."""
    import gc

    gc.unfreeze()
    gc.collect()
    return gc.get_freeze_count()


@pytest.fixture
def poisoned(monkeypatch):
    """Ops' floating-point outputs without ``init`` start as NaN (not whatever
    ``torch.empty`` gives, often zeros on CPU): an element a kernel does not write shows."""
    from pnex_magic import op as op_module

    allocate = op_module._allocate

    def poison(spec, env, device, fake):
        outs = allocate(spec, env, device, fake)
        if not fake:
            for p, t in zip(spec.outputs, outs):
                if p.init is None and t.dtype.is_floating_point:
                    t.fill_(float("nan"))
        return outs

    monkeypatch.setattr(op_module, "_allocate", poison)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """Point ``$PNEX_CACHE_DIR`` at a new, empty directory for this test and reset
    ``pnex_magic.cache.stats``; yields the directory (a ``pathlib.Path``)."""
    from pnex_magic import cache

    path = tmp_path / "pnex-cache"
    path.mkdir()
    monkeypatch.setenv("PNEX_CACHE_DIR", str(path))
    cache.stats.reset()
    yield path
    cache.stats.reset()


@pytest.fixture
def gpu_cache(tmp_path, monkeypatch):
    """A private, empty ``$PNEX_CACHE_DIR`` for one GPU test that shares the session's
    C++ launcher build (so that neither the test nor its subprocesses build it again),
    with autotuning on; returns its path."""
    fresh = tmp_path / "pnex-cache"
    fresh.mkdir()
    session = os.environ.get("PNEX_CACHE_DIR")
    if session:
        (Path(session) / "launcher").mkdir(parents=True, exist_ok=True)
        (fresh / "launcher").symlink_to(Path(session) / "launcher", target_is_directory=True)
    monkeypatch.setenv("PNEX_CACHE_DIR", str(fresh))
    monkeypatch.delenv("PNEX_AUTOTUNE", raising=False)
    return fresh


@pytest.fixture(params=["native", "driver"])
def launcher(request, monkeypatch):
    """Run a test with each GPU launcher: the C++ one and the Python driver one."""
    monkeypatch.setenv("PNEX_LAUNCHER", request.param)
    return request.param


@pytest.fixture
def pnex_env():
    """A copy of ``os.environ`` for subprocesses that import pnex_magic: same cache
    directory, no inherited ``PYTHONOPTIMIZE`` surprises, quiet warnings."""
    env = dict(os.environ)
    env.pop("PYTHONOPTIMIZE", None)
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory) -> Path:
    """A folder for the stand-ins that let the C++ launcher build and import without CUDA
    (``tests/launcher_stand_in.py``)."""
    return tmp_path_factory.mktemp("stand-in")


@pytest.fixture(scope="session")
def built_launcher(stand_in, tmp_path_factory) -> Path:
    """The C++ launcher built once per session with the stand-ins (in the foreground, as
    PNEX_LAUNCHER=native does): its build folder, for cases that start from a built
    launcher.  15 to 60 s on two shared cores."""
    import launcher_stand_in

    cache = tmp_path_factory.mktemp("built") / "cache"
    env = dict(launcher_stand_in.environment(dict(os.environ), stand_in), PNEX_CACHE_DIR=str(cache),
               PNEX_LAUNCHER="native")
    code = "from pnex_magic.launch import native\nnative.load_launcher()\nprint('RESULT ' + repr(native._target().folder.name))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    name = done.stdout.split("RESULT ", 1)[1].strip().strip("'")
    return cache / "launcher" / name


@pytest.fixture
def pip_target(tmp_path):
    """``pip_target(name, *requirements)``: install the requirements (without their
    dependencies) into a new folder, for ``PYTHONPATH``; returns it.  Skips the test
    when pip cannot fetch them (offline), fails it under CI."""

    def install(name: str, *requirements: str):
        folder = tmp_path / name
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(folder), *requirements],
            capture_output=True, text=True, timeout=900,
        )
        if pip.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"pip could not install {requirements}:\n{pip.stderr[-2000:]}")
            pytest.skip(f"pip could not install {requirements} (offline?): {pip.stderr.strip().splitlines()[-1:]}")
        return folder

    return install
