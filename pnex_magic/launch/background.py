"""A one-time build, once per environment, in a process of its own.

pnex's C++ extensions (the PyTorch launcher, the XLA FFI handler) take seconds to
tens of seconds to compile, so a process that needs one starts its build in a
detached process (:func:`start`: ``python -m pnex_magic.launch.build_worker``) and
keeps serving through the Python launchers until it is there.  The build process
is in a session of its own, so it finishes, and what it built is kept, even when
the notebook or script that started it exits first or is interrupted.

* **One build per key.**  A build process holds an ``flock`` on its build's key
  (released by the OS if it dies); one started at the same moment by another
  process waits for it, then finds the build done, or failed: then it stops too
  (building again had one process report the failure while another loaded what the
  second build made).  A process that sees the lock held starts none.
* **Nothing half-built is ever loaded.**  The build compiles into a temporary folder
  (``.<folder>.tmp-<pid>``), checks that the result loads, records it, and renames
  the folder into place; a reader loads only a recorded build
  (:func:`~pnex_magic.launch.build.built_library`).  A killed build leaves its
  temporary folder only, which the next build removes, before it starts or when it
  is done, once nothing works in it (ninja starts each compiler in a process group of
  its own, so they outlive a kill of the build's).
* **A failure is recorded once.**  The compiler's whole output goes to
  ``<folder>.log`` and a record to ``<folder>.failed.json``; while the build's inputs
  (sources, flags, include folders, torch, Python: its key) and the toolchain (the
  compiler, ninja) are unchanged, no process tries again (:func:`failure`), and the
  one note a process shows names the log.  Removing the record tries again.
* **It stays out of the way.**  It runs at a lower priority (``nice``) with one
  compile job per translation unit, at most one per core (``MAX_JOBS`` overrides).

:func:`build_now` runs the same build in the foreground and waits for it, with a
progress line every few seconds (``PNEX_LAUNCHER=native``, where a process wants the
C++ launcher before its first call).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..cache import build_lock
from ..errors import KernelCompileError
from .build import Build, compile_into, compiler, import_built, toolchain

__all__ = [
    "state", "failure", "problem", "start", "wait", "build_now", "run", "progress", "unwritable", "log_path",
    "processes", "build_extension",
    "build_shared_library",
]

log = logging.getLogger(__name__)

#: Build processes this process started (their pids, reaped by :func:`state`), by build folder.
_started: dict[Path, int] = {}
#: Guards _started; held by :func:`start` from its look at the state to the new process's
#: pid recorded, so that a thread looking meanwhile sees it building (not "none", which
#: would start a second build and spend the one restart a killed build gets).
_lock = threading.RLock()


def _lock_path(build: Build) -> Path:
    return build_lock(build.folder)


def hold(build: Build):
    """Take ``build``'s lock as its build process does, and return the open lock file
    (``fcntl.flock(f, fcntl.LOCK_UN)`` or closing it lets go): while it is held no build
    of that key runs, which is how the tests and benchmarks time a first run before
    the build.  Makes the cache's folder where it is not there yet (a fresh cache)."""
    lock_file = _open_lock(build)
    fcntl.flock(lock_file, fcntl.LOCK_EX)
    return lock_file


def _open_lock(build: Build):
    """``build``'s lock file, opened (not locked), its folder made where it is not there."""
    path = _lock_path(build)
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a")  # noqa: SIM115 -- the caller keeps it


def _failure_path(build: Build) -> Path:
    return build.folder.parent / f"{build.folder.name}.failed.json"


def log_path(build: Build) -> Path:
    """Where the build's output goes (the compiler's messages of a failed build)."""
    return build.folder.parent / f"{build.folder.name}.log"


def failure(build: Build) -> dict[str, Any] | None:
    """The record of a failed build of ``build`` (``error``, ``log``), if it holds: its
    key and the toolchain are those of now."""
    try:
        record = json.loads(_failure_path(build).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != build.key or record.get("toolchain") != toolchain():
        return None
    return record


def unwritable(build: Build) -> str | None:
    """Why the build's folder cannot be written (``None`` if it can): a read-only
    cache folder, or one under a file."""
    try:
        build.folder.parent.mkdir(parents=True, exist_ok=True)
        with open(_lock_path(build), "a"):
            pass
    except OSError as exc:
        return f"its build folder {build.folder} cannot be written ({type(exc).__name__}: {exc.strerror or exc})"
    return None


def problem(build: Build) -> str | None:
    """Why ``build`` cannot be built here, in a sentence (``None`` if it can be tried):
    no host compiler, no ninja (an extension), a folder that cannot be written, or a
    failure recorded for these inputs and this toolchain (naming its log)."""
    tools = toolchain()
    if tools["compiler"] is None:
        return f"the {build.what} needs a host C++ compiler ({compiler()} is not installed: install g++ or set $CXX)"
    if build.kind == "extension" and tools["ninja"] is None:
        return f"the {build.what}'s build needs ninja (pip install ninja)"
    unusable = unwritable(build)
    if unusable is not None:
        return f"the {build.what} cannot be built: {unusable}; set PNEX_CACHE_DIR to a writable folder"
    record = failure(build)
    if record is not None:
        return (f"the {build.what}'s build failed ({record.get('error', 'see its log')}); the compiler's output is in "
                f"{record.get('log', log_path(build))}")
    return None


def _lock_held(build: Build) -> bool:
    """Whether a build process holds the build's lock now."""
    try:
        with open(_lock_path(build), "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def state(build: Build) -> str:
    """``"built"``, ``"failed"`` (:func:`failure`), ``"building"`` (a build process holds
    its lock, or this process started one that has not ended) or ``"none"``."""
    with _lock:
        pid = _started.get(build.folder)
        running = pid is not None and _running(pid)
    # The lock first, the folder after: a build that ends between the two reads is then
    # seen built.  (Read the other way round, a build renamed into place and unlocked
    # between them looked like no build at all, and a process waiting for another's build
    # gave up: seen once in CI-like load, tests/test_first_run.py.)
    held = running or _lock_held(build)
    if build.built() is not None:
        return "built"
    if failure(build) is not None:
        return "failed"
    if held:
        return "building"
    return "none"


def start(build: Build, *, background: bool = True) -> bool:
    """Start a build process for ``build`` unless it is built, failed (for this
    toolchain), already building, or its folder cannot be written; returns whether
    a build is under way now."""
    with _lock:
        found = state(build)
        if found != "none":
            return found == "building"
        if unwritable(build) is not None:
            return False
        _started[build.folder] = _spawn(build, background)
    return True


def _spawn(build: Build, background: bool) -> int:
    """Start ``build``'s build process; returns its pid."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding pnex_magic
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env["PNEX_BUILD_NICE"] = "10" if background else "0"
    with open(log_path(build), "a") as out:  # what the process says before its build starts (an import error)
        proc = subprocess.Popen(
            [sys.executable, "-m", "pnex_magic.launch.build_worker", build.to_json()],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            close_fds=True,
        )
    # Detached: this process reaps it (state() waits for it without blocking), so that
    # Popen's finaliser, at exit, neither waits for it nor warns that it still runs.
    proc.returncode = 0
    log.debug("pnex: building the %s in process %d", build.what, proc.pid)
    return proc.pid


def _running(pid: int) -> bool:
    """Whether the build process ``pid`` this process started still runs (reaping it if not)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped already
        return False
    return done == 0


def wait(build: Build, timeout: float | None = None) -> str:
    """Wait until ``build`` is built or failed (or ``timeout`` seconds passed); returns
    its :func:`state`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        found = state(build)
        if found in ("built", "failed", "none"):
            return found
        if deadline is not None and time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def failure_error(build: Build, record: dict[str, Any]) -> KernelCompileError:
    """The error a recorded failure is raised as, with the compiler's output."""
    compiler_log = ""
    with contextlib.suppress(OSError):
        compiler_log = Path(record.get("log", "")).read_text()
    return KernelCompileError(
        f"pnex could not build its {build.what}: {record.get('error', '')} (the compiler's output: {record.get('log')}; "
        f"remove {_failure_path(build)} to try again)",
        compiler_log=compiler_log,
    )


def build_now(build: Build) -> Path:
    """Build ``build`` in the foreground (a build process this one waits for, with a
    progress line every few seconds), unless it is built; returns its library.  A
    failure (now, or recorded for this toolchain) raises
    :class:`~pnex_magic.errors.KernelCompileError` with the compiler's output."""
    library = build.built()
    if library is not None:
        return library
    problem = unwritable(build)
    if problem is not None:
        raise KernelCompileError(f"pnex could not build its {build.what}: {problem}; set PNEX_CACHE_DIR to a writable folder")
    record = failure(build)
    if record is None:
        with progress(f"building the {build.what}"):
            start(build, background=False)
            wait(build)
        record = failure(build)
    library = build.built()
    if library is not None:
        return library
    if record is None:  # the build process died without a word (killed)
        raise KernelCompileError(f"pnex could not build its {build.what}: its build process ended before it was done")
    raise failure_error(build, record)


def build_extension(stem: str, sources: Sequence[Path], *, includes: Sequence[str], cflags: Sequence[str] = ("-O2",),
                    ldflags: Sequence[str] = (), headers: Sequence[Path] = (), what: str, verbose: bool = False,
                    built_only: bool = False) -> Any:
    """The torch C++ extension ``stem`` built from ``sources`` (which include
    ``headers``), imported: built first in the foreground (:func:`build_now`) unless
    it is built, or with ``built_only`` only if it is (``None`` otherwise)."""
    target = Build(stem, "extension", what, tuple(map(str, sources)), includes=tuple(includes), cflags=tuple(cflags),
                   ldflags=tuple(ldflags), headers=tuple(map(str, headers)), verbose=verbose)
    module = import_built(target.name, target.folder)
    if module is None and not built_only:
        build_now(target)
        module = import_built(target.name, target.folder)
        if module is None:
            raise KernelCompileError(f"pnex built its {what} in {target.folder}, but it does not import")
    return module


def build_shared_library(stem: str, sources: Sequence[Path], *, includes: Sequence[str], headers: Sequence[Path] = (),
                         cflags: Sequence[str] = ("-O2",), ldflags: Sequence[str] = (), key_extra: str = "", what: str,
                         verbose: bool = False) -> Path:
    """The plain shared library ``lib<stem>.so`` built from ``sources`` with the host
    C++ compiler, for ``ctypes``: built first in the foreground unless it is built.
    ``headers`` and ``key_extra`` (e.g. the version of the package whose headers are
    included) join the build key."""
    return build_now(Build(stem, "library", what, tuple(map(str, sources)), includes=tuple(includes),
                           cflags=tuple(cflags), ldflags=tuple(ldflags), headers=tuple(map(str, headers)),
                           key_extra=key_extra, verbose=verbose))


@contextlib.contextmanager
def progress(message: str):
    """Tell the user a slow one-time step is running, every few seconds."""
    done = threading.Event()
    begin = time.perf_counter()
    print(f"pnex: {message} (once per environment)...", file=sys.stderr, flush=True)

    def tick():
        while not done.wait(5.0):
            print(f"pnex: {message}... {time.perf_counter() - begin:.0f} s", file=sys.stderr, flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        print(f"pnex: {message}: done in {time.perf_counter() - begin:.1f} s", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- the build process


def run(build: Build) -> int:
    """The build process's work (:mod:`.build_worker`): under the build's lock, build it
    into a temporary folder and rename that into place, or record the failure; 0 when
    the build is there at the end."""
    with contextlib.suppress(OSError, ValueError):
        os.nice(int(os.environ.get("PNEX_BUILD_NICE", "0")))
    root = build.folder.parent
    try:
        lock_file = _open_lock(build)  # closed by the with block below
    except OSError:
        return 1  # nothing can be recorded either; the starting process said why
    with lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if build.built() is not None:
            return 0
        if failure(build) is not None:
            # The build that held the lock before failed, for these inputs and this
            # toolchain: that stands for every process (its starter has said so), as it
            # does for one that starts later.  Building again here had one process give
            # up on a failure while another loaded what this build made of it.
            return 1
        _sweep(build)
        temporary = root / f".{build.folder.name}.tmp-{os.getpid()}"
        units = max(1, len([s for s in build.sources if s.endswith(".cpp")]))
        os.environ.setdefault("MAX_JOBS", str(max(1, min(units, os.cpu_count() or 1))))
        begin = time.perf_counter()
        try:
            with open(log_path(build), "a") as out:  # one section per build (tests count them)
                out.write(f"pnex: building the {build.what} ({build.key}) in {temporary}\n")
                out.flush()
                try:
                    compile_into(build, temporary)
                except BaseException as exc:  # noqa: BLE001 - every failure is recorded
                    text = getattr(exc, "compiler_log", "") or "".join(traceback.format_exception(exc))
                    out.write(text)
                    error = str(exc).strip().removeprefix(f"pnex could not build its {build.what}: ")
                    _record_failure(build, error.splitlines()[0][:300] if error else type(exc).__name__)
                    shutil.rmtree(temporary, ignore_errors=True)
                    return 1
                out.write(f"pnex: built in {time.perf_counter() - begin:.1f} s\n")
            if build.folder.exists():  # an unrecorded (partial) folder of an older pnex
                shutil.rmtree(build.folder)
            os.rename(temporary, build.folder)
            _failure_path(build).unlink(missing_ok=True)
            _sweep(build)  # the compilers a killed build left running (ninja gives each its own process group) are done by now
        except OSError as exc:
            _record_failure(build, f"writing its build folder failed ({type(exc).__name__}: {exc})")
            shutil.rmtree(temporary, ignore_errors=True)
            return 1
    return 0


def _record_failure(build: Build, error: str) -> None:
    record = {"key": build.key, "toolchain": toolchain(), "error": error, "log": str(log_path(build)),
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    with contextlib.suppress(OSError):
        partial = _failure_path(build).with_name(f"{_failure_path(build).name}.{os.getpid()}")
        partial.write_text(json.dumps(record))
        partial.replace(_failure_path(build))


def _sweep(build: Build) -> None:
    """Remove the temporary folders that killed builds of ``build`` left, once nothing
    works in them (their compilers outlive them)."""
    for folder in build.folder.parent.glob(f".{build.folder.name}.tmp-*"):
        if not _builders_left_running(folder):
            shutil.rmtree(folder, ignore_errors=True)


def processes(cache: Path) -> list[int]:
    """The build processes at work for the cache folder ``cache`` (their
    ``PNEX_CACHE_DIR``), of this user."""
    found = []
    for pid in filter(str.isdigit, _proc_entries()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pnex_magic.launch.build_worker" in command and f"PNEX_CACHE_DIR={cache}".encode() in environment:
            found.append(int(pid))
    return found


def _proc_entries() -> list[str]:
    try:
        return os.listdir("/proc")
    except OSError:  # no /proc: no process can be seen
        return []


def _builders_left_running(folder: Path) -> list[int]:
    """Processes working in ``folder`` (torch runs ninja there, and the compiler
    inherits it): what a build whose Python process was killed leaves running."""
    target = os.path.realpath(folder)
    found = []
    for pid in (int(p) for p in _proc_entries() if p.isdigit()):
        try:
            if pid != os.getpid() and os.readlink(f"/proc/{pid}/cwd") == target:
                found.append(pid)
        except OSError:
            continue
    return found
