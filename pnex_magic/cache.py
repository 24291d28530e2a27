"""The on-disk cache of compiled kernels, and of small records such as autotune choices.

Location: ``$PNEX_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/pnex_magic``, else
``~/.cache/pnex_magic``.  Each entry is a folder holding ``meta.json`` and the
artifacts (``kernel.ptx``, ``kernel.cubin``).  An entry's folder is named by its
content key, or by the user's ``cache_id``: then entries with the same
``cache_id`` evict each other, and a key mismatch is a miss (recompile), never a
wrong result.  Only successful builds are written.

Several processes may share the folder and any of them may be killed at any
moment, so an entry is never changed in place: it is written to a hidden
temporary folder and renamed into place; an entry it replaces is first renamed
aside (hidden) and then removed.  A reader therefore finds a whole entry or none,
and reads all of its files through one handle on the entry's folder, so a
concurrent replacement cannot mix two entries.  Hidden leftovers of killed
processes are ignored and swept after an hour.  A cache folder that cannot be
written (read-only, or under a file) is said once, as a warning; kernels are then
compiled in every process.

Records (:func:`store_record`, :func:`load_record`, :func:`records`) are one JSON
file each under a folder per kind (``autotune/``), named by their key and
replaced atomically; the autotuner keeps one per GPU model, kernel build and key,
and the CUDA simulator one per typed kernel (``simulated/``: :mod:`pnex_magic.simtyping.stored`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "cache_dir", "CacheEntry", "load", "store", "entries", "clear", "stats",
    "Record", "load_record", "store_record", "records", "remove_record",
]


@dataclasses.dataclass
class CacheStats:
    """Counters for tests and the report: how often a lookup hit or missed."""

    hits: int = 0
    misses: int = 0

    def reset(self) -> None:
        self.hits = self.misses = 0


stats = CacheStats()
log = logging.getLogger(__name__)
_HIDDEN = (".tmp-", ".old-")  # prefixes of a writer's temporary folders
_SWEEP_AFTER_S = 3600.0
_warned_unwritable: set[str] = set()


def cache_dir() -> Path:
    env = os.environ.get("PNEX_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pnex_magic"


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    path: Path
    meta: dict[str, Any]
    files: dict[str, bytes] | None = None  # read by load(); None: read from disk on demand

    def read_bytes(self, name: str) -> bytes | None:
        if self.files is not None:
            return self.files.get(name)
        p = self.path / name
        return p.read_bytes() if p.exists() else None

    def read_text(self, name: str) -> str | None:
        data = self.read_bytes(name)
        return None if data is None else data.decode()


def _slot(key: str, cache_id: str | None) -> str:
    if cache_id:
        return "id-" + re.sub(r"[^A-Za-z0-9_.-]", "_", cache_id)
    return key[:40]


def _read_at(folder: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=folder)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def load(key: str, cache_id: str | None = None) -> CacheEntry | None:
    """The entry for ``key`` with all its files read, or ``None`` (a miss).  An entry
    missing any file its ``meta.json`` lists is a miss."""
    path = cache_dir() / _slot(key, cache_id)
    try:
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        stats.misses += 1
        return None
    try:
        meta = json.loads(_read_at(folder, "meta.json"))
        if meta.get("key") != key:
            raise ValueError("another key")
        names = meta.get("files") or [n for n in os.listdir(folder) if n != "meta.json"]
        files = {name: _read_at(folder, name) for name in names}
    except (OSError, ValueError, AttributeError):
        stats.misses += 1
        return None
    finally:
        os.close(folder)
    stats.hits += 1
    return CacheEntry(path, meta, files)


def store(key: str, meta: dict[str, Any], files: dict[str, str | bytes], cache_id: str | None = None) -> Path | None:
    """Write an entry atomically, replacing any entry in its slot; returns its folder,
    or ``None`` if the cache is not writable (said once per folder, as a warning) or
    another process replaced the slot at the same moment."""
    root = cache_dir()
    final = root / _slot(key, cache_id)
    tmp: Path | None = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_HIDDEN[0], dir=root))
        for name, data in files.items():
            (tmp / name).write_bytes(data.encode() if isinstance(data, str) else data)
        record = {**meta, "key": key, "created": time.time(), "files": sorted(files)}
        (tmp / "meta.json").write_text(json.dumps(record, indent=1))
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _warn_unwritable(root, exc)
        return None
    try:
        _move_into_place(tmp, final)
    except OSError:  # another process replaced the slot meanwhile: its entry stands
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    _sweep(root)
    return final


def _move_into_place(tmp: Path, final: Path) -> None:
    try:
        os.replace(tmp, final)  # no entry there yet
        return
    except OSError:
        if not final.exists():
            raise
    # Rename the old entry aside first (never delete inside a visible entry: a process
    # killed halfway would leave half of it), then put the new one in its place.
    aside = final.with_name(f"{_HIDDEN[1]}{final.name}-{uuid.uuid4().hex[:12]}")
    os.rename(final, aside)
    try:
        os.replace(tmp, final)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _sweep(root: Path) -> None:
    """Remove the temporary folders of killed writers (hidden, over an hour old)."""
    now = time.time()
    try:
        for path in root.iterdir():
            if path.name.startswith(_HIDDEN) and now - path.stat().st_mtime > _SWEEP_AFTER_S:
                shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


def _warn_unwritable(root: Path, exc: OSError) -> None:
    if str(root) in _warned_unwritable:
        return
    _warned_unwritable.add(str(root))
    log.warning(
        "pnex: the compile cache folder %s cannot be written (%s: %s), so compiled kernels are not "
        "cached and each new process compiles them again; set PNEX_CACHE_DIR to a writable folder",
        root,
        type(exc).__name__,
        exc.strerror or exc,
    )


def entries() -> list[CacheEntry]:
    root = cache_dir()
    found = []
    if root.is_dir():
        for path in sorted(root.iterdir()):
            if path.name.startswith("."):
                continue  # a writer's temporary folder, or not ours
            try:
                found.append(CacheEntry(path, json.loads((path / "meta.json").read_text())))
            except (OSError, ValueError):
                continue
    return found


def clear() -> int:
    """Remove every entry (and leftovers of killed writers); returns how many entries
    were removed."""
    removed = 0
    for entry in entries():
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    root = cache_dir()
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith(_HIDDEN):
                shutil.rmtree(path, ignore_errors=True)
    return removed


# --------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class Record:
    """One stored record: its file and its data (``key`` and ``created`` included)."""

    path: Path
    data: dict[str, Any]


def _record_path(kind: str, key: str) -> Path:
    return cache_dir() / kind / f"{key[:40]}.json"


def load_record(kind: str, key: str) -> dict[str, Any] | None:
    """The data stored under ``key`` for ``kind``, or ``None``."""
    try:
        data = json.loads(_record_path(kind, key).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def store_record(kind: str, key: str, data: dict[str, Any]) -> Path | None:
    """Write a record atomically (JSON-serialisable ``data``); returns its file, or
    ``None`` if the cache is not writable."""
    final = _record_path(kind, key)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=final.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({**data, "key": key, "created": time.time()}, f, indent=1)
        os.replace(tmp, final)
    except OSError:
        return None
    return final


def records(kind: str) -> list[Record]:
    """Every readable record of ``kind``, oldest file name first."""
    folder = cache_dir() / kind
    found = []
    if folder.is_dir():
        for path in sorted(folder.glob("*.json")):
            try:
                found.append(Record(path, json.loads(path.read_text())))
            except (OSError, ValueError):
                continue
    return found


def remove_record(record: Record) -> None:
    with contextlib.suppress(OSError):
        record.path.unlink()
