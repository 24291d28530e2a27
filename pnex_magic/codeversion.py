"""The version of pnex_magic's own code, as the compile cache sees it.

Every cache key (:func:`pnex_magic.definition.toolchain_versions`) holds the versions
of the tools that change compiled code, and the code that decides what pnex asks them
to compile is one of those tools: a change to an intrinsic's inline PTX in
:mod:`pnex_magic.tc.bulk` makes another cubin of the same kernel.  A release's
version number covers its code, but a development install (``pip install -e .``, a
git checkout on ``PYTHONPATH``) keeps its version while its code changes, and a
cubin compiled by yesterday's code would be served today.  :func:`code_version`
therefore names the code itself:

* **an installed wheel** (a ``pnex_magic-*.dist-info`` beside the package, not an
  editable one, PEP 610): the SHA-256 of the wheel's ``RECORD``, which lists the
  SHA-256 of every file it installed.  One small file read.
* **anything else** (an editable install, a checkout): the SHA-256 of the contents of
  the package's ``*.py`` files (:func:`code_files`), by path.  Reading them costs a
  few milliseconds, so each file's digest is kept in a cache record (kind ``code``)
  with the file's size, mtime, ctime and inode, and the tree's digest with all of
  them: a later process stats the files and reads one again only where one of those
  changed (ctime changes on every write, and no tool sets it back).  A ``git checkout`` that touches files without changing them costs a re-read,
  not a recompile; two worktrees at the same commit share their compiled kernels.

:func:`code_files` leaves out the modules that do not change anything the cache holds:
the front ends (they choose a kernel's source and options, which the key holds as
such), the report and its measurements, the external tools (Nsight Compute,
compute-sanitizer) and saved artifacts (a loaded artifact runs the code it carries).
Nothing that compiles, types, checks, launches or tunes a kernel imports them
(``tests/test_code_version.py`` checks that on the import graph).  The C++ launcher's
sources (``csrc/``) are keyed by their own build (:func:`pnex_magic.launch.build.build_key`).

Computed once per process, when a cache key is first made.  A kernel whose options
turn the cache off (``JitOptions(use_cache=False)``) asks with ``use_cache=False``:
then no record is read or written, every file is read (the same version, a few
milliseconds more), and the cache folder is not touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from . import cache
from ._version import __version__

__all__ = ["code_version", "code_files", "EXCLUDED"]

log = logging.getLogger(__name__)

#: Files and folders of the package (relative, ``/``-separated) the code version leaves
#: out: what they do never reaches a compiled kernel or a cache record (see above).
EXCLUDED = frozenset({
    "frontends", "render", "artifact", "csrc", "__main__.py",
    # the report and what it measures and advises
    "report.py", "timing.py", "timers.py", "ceiling.py", "efficiency.py", "profiles.py", "roofline.py",
    "callfacts.py", "tune_template.py",
    # external tools run on compiled kernels
    "profiling.py", "_profile_child.py", "ncu.py", "sanitize.py", "_sanitize_child.py",
})

_PACKAGE = Path(__file__).resolve().parent
_RECORD_KIND = "code"  # the cache records of the digests (two per package folder)
_RACY_NS = 3_000_000_000


_version: list[str] = []  # this process's, once computed


def code_version(*, use_cache: bool = True) -> str:
    """``wheel:<digest>`` or ``source:<digest>`` (16 hex digits) for this process's
    pnex_magic, as described in the module's docstring; computed once per process.
    ``use_cache=False``: the digests kept in the cache folder are neither read nor
    written (the version is the same)."""
    if not _version:
        _version.append(_code_version(_PACKAGE, use_cache))
    return _version[0]


def _code_version(package: Path, use_cache: bool = True) -> str:
    record = _wheel_record(package)
    if record is not None:
        return "wheel:" + hashlib.sha256(record).hexdigest()[:16]
    return "source:" + _source_digest(package, use_cache)


def _wheel_record(package: Path) -> bytes | None:
    """The ``RECORD`` of the (not editable) wheel that installed ``package``, or
    ``None``: it must sit in a dist-info folder beside the package and list the
    package's files; where two do, neither is trusted."""
    found = []
    try:
        names = os.listdir(package.parent)
    except OSError:
        return None
    for name in names:
        if not (name.startswith(f"{package.name}-") and name.endswith(".dist-info")):
            continue
        info = package.parent / name
        try:
            record = (info / "RECORD").read_bytes()
        except OSError:
            continue
        if f"\n{package.name}/definition.py,sha256=".encode() not in b"\n" + record:
            continue
        if _editable(info):
            continue
        found.append(record)
    return found[0] if len(found) == 1 else None


def _editable(info: Path) -> bool:
    try:
        direct = json.loads((info / "direct_url.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(isinstance(direct, dict) and (direct.get("dir_info") or {}).get("editable"))


def code_files(package: Path | None = None) -> list[str]:
    """The package's files the source digest covers, relative, sorted."""
    return [rel for rel, _ in _listing(_PACKAGE if package is None else package)]


def _listing(package: Path) -> list[tuple[str, os.DirEntry]]:
    found: list[tuple[str, os.DirEntry]] = []

    def walk(folder: str, prefix: str) -> None:
        with os.scandir(folder) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if rel in EXCLUDED or entry.name == "__pycache__" or entry.name.startswith("."):
                    continue
                if entry.name.endswith(".py"):
                    found.append((rel, entry))
                elif entry.is_dir():
                    walk(entry.path, rel + "/")

    walk(str(package), "")
    found.sort(key=lambda item: item[0])
    return found


def _source_digest(package: Path, use_cache: bool = True) -> str:
    try:
        listing = _listing(package)
    except OSError as exc:  # not a folder of files (never seen): no digest to give
        log.warning("pnex: cannot read pnex_magic's own files in %s (%s): compiled kernels are cached by its "
                    "version (%s) alone", package, exc, __version__)
        return "unreadable"
    stamps: dict[str, str] = {}
    racy_after = time.time_ns() - _RACY_NS
    for rel, entry in listing:
        try:
            st = entry.stat()
        except OSError:  # removed meanwhile: as if it were not there
            continue
        # A file changed within the last seconds may change again within its timestamps'
        # granularity (git's "racy" files): its stamp is not trusted, it is read every time.
        racy = max(st.st_mtime_ns, st.st_ctime_ns) >= racy_after
        stamps[rel] = "racy" if racy else f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    # One record holds the digest of the whole tree under the stamps of all its files (a
    # process finds it unchanged by one comparison), another each file's digest under its
    # stamp (a changed tree reads only its changed files).
    slot = hashlib.sha256(str(package).encode()).hexdigest()
    files_slot = hashlib.sha256(f"{package}\0files".encode()).hexdigest()
    tree = hashlib.sha256("\n".join(f"{rel}:{stamp}" for rel, stamp in stamps.items()).encode()).hexdigest()
    summary = cache.load_record(_RECORD_KIND, slot) if use_cache else None
    if summary and summary.get("stamps") == tree and isinstance(summary.get("version"), str):
        return summary["version"]
    known = (cache.load_record(_RECORD_KIND, files_slot) if use_cache else None) or {}
    known = known.get("files") if known.get("package") == str(package) else None
    known = known if isinstance(known, dict) else {}
    files: dict[str, str] = {}
    total = hashlib.sha256()
    for rel, stamp in stamps.items():
        old = known.get(rel)
        if stamp != "racy" and isinstance(old, str) and len(old) == len(stamp) + 65 and old.startswith(stamp + "="):
            digest = old[len(stamp) + 1:]
        else:
            try:
                with open(package / rel, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            except OSError:
                continue
        files[rel] = f"{stamp}={digest}"
        total.update(f"{rel}\0{digest}\n".encode())
    version = total.hexdigest()[:16]
    if not use_cache:
        return version
    cache.store_record(_RECORD_KIND, files_slot, {"package": str(package), "files": files})
    if "racy" not in stamps.values():
        cache.store_record(_RECORD_KIND, slot, {"package": str(package), "stamps": tree, "version": version})
    return version
