"""The on-disk cache of compiled kernels, and of small records such as autotune choices.

Location: ``$PNEX_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/pnex_magic``, else
``~/.cache/pnex_magic``.  Each entry is a folder holding ``meta.json`` and the
artifacts (``kernel.ptx``, ``kernel.cubin``).  An entry's folder is named by its
content key, or by the user's ``cache_id``: then entries with the same
``cache_id`` evict each other, and a key mismatch is a miss (recompile), never a
wrong result.  Entries are written to a temporary folder and renamed into place,
so a killed process never leaves half an entry, and only successful builds are
written.

Records (:func:`store_record`, :func:`load_record`, :func:`records`) are one JSON
file each under a folder per kind (``autotune/``), named by their key and
replaced atomically; the autotuner keeps one per GPU model, kernel build and key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
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

    def read_text(self, name: str) -> str | None:
        p = self.path / name
        return p.read_text() if p.exists() else None

    def read_bytes(self, name: str) -> bytes | None:
        p = self.path / name
        return p.read_bytes() if p.exists() else None


def _slot(key: str, cache_id: str | None) -> str:
    if cache_id:
        return "id-" + re.sub(r"[^A-Za-z0-9_.-]", "_", cache_id)
    return key[:40]


def load(key: str, cache_id: str | None = None) -> CacheEntry | None:
    """The entry for ``key``, or ``None`` (a miss)."""
    path = cache_dir() / _slot(key, cache_id)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        stats.misses += 1
        return None
    if meta.get("key") != key:
        stats.misses += 1
        return None
    stats.hits += 1
    return CacheEntry(path, meta)


def store(key: str, meta: dict[str, Any], files: dict[str, str | bytes], cache_id: str | None = None) -> Path | None:
    """Write an entry atomically; returns its folder, or ``None`` if the cache is not writable."""
    root = cache_dir()
    final = root / _slot(key, cache_id)
    tmp: Path | None = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        for name, data in files.items():
            if isinstance(data, str):
                (tmp / name).write_text(data)
            else:
                (tmp / name).write_bytes(data)
        (tmp / "meta.json").write_text(json.dumps({**meta, "key": key, "created": time.time()}, indent=1))
        if final.exists():
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except OSError:
        # e.g. another process put an entry in place between the removal and the rename
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        return None
    return final


def entries() -> list[CacheEntry]:
    root = cache_dir()
    found = []
    if root.is_dir():
        for path in sorted(root.iterdir()):
            try:
                found.append(CacheEntry(path, json.loads((path / "meta.json").read_text())))
            except (OSError, ValueError):
                continue
    return found


def clear() -> int:
    """Remove every entry; returns how many were removed."""
    removed = 0
    for entry in entries():
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
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
