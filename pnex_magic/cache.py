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
file each under a folder per kind (:data:`RECORD_KINDS`), named by their key and
replaced atomically: the autotuner's choices (``autotune/``, one per GPU model,
kernel build and key), the CUDA simulator's typed kernels (``simulated/``:
:mod:`pnex_magic.simtyping.stored`), the digests of pnex's own files behind the code
version in every key (``code/``: :mod:`pnex_magic.codeversion`) and the report's SASS
listings (``sass/``).  Three more folders hold what other stages make
(:func:`folder`): the C++ launcher's and the XLA FFI handler's builds (``launcher/``),
copies of CUDA tools whose wheels lack the executable bit (``tools/``) and Nsight
Compute reports (``profiles/``).  :data:`PARTS` names them all; :func:`usage` counts
them and :func:`clear` removes them (a kernel whose options say ``use_cache=False``
reads and writes none of its own: see :class:`pnex_magic.definition.JitOptions`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "cache_dir", "CacheEntry", "load", "store", "entries", "clear", "stats",
    "Record", "load_record", "store_record", "records", "remove_record",
    "PARTS", "RECORD_KINDS", "KERNEL_PARTS", "folder", "build_lock", "usage", "Usage", "Cleared", "describe",
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


# --------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class Record:
    """One stored record: its file and its data (``key`` and ``created`` included)."""

    path: Path
    data: dict[str, Any]


def _record_path(kind: str, key: str) -> Path:
    if kind not in RECORD_KINDS:  # a new kind is named in RECORD_KINDS, so that clear() and usage() know it
        raise ValueError(f"pnex cache: no record kind {kind!r}; the kinds are {', '.join(RECORD_KINDS)}")
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
    """Every readable record of ``kind``, in the order of their file names."""
    where = _record_path(kind, "").parent
    found = []
    if where.is_dir():
        for path in sorted(where.glob("*.json")):
            try:
                found.append(Record(path, json.loads(path.read_text())))
            except (OSError, ValueError):
                continue
    return found


def remove_record(record: Record) -> None:
    with contextlib.suppress(OSError):
        record.path.unlink()


# --------------------------------------------------------------------------- parts: counted, cleared

#: What pnex keeps in its cache folder, by the name :func:`usage` and :func:`clear` count
#: it under, and what one item of it is.
PARTS: dict[str, str] = {
    "kernels": "compiled kernels: a folder each (PTX, cubin, resources)",
    "autotune": "autotune choices: a record each (GPU model, kernel build and key)",
    "simulated": "the CUDA simulator's typed kernels: a record each",
    "code": "digests of pnex_magic's own files, behind the code version in every key: a record each",
    "sass": "SASS listings shown by the report: a record each",
    "launcher": "builds of the C++ launcher and the XLA FFI handler: a build's folder, log and failure record together",
    "tools": "copies of CUDA tools whose wheels lack the executable bit: a folder each",
    "profiles": "Nsight Compute reports of %%pnex --profile: a file each",
}
#: The parts that are folders of records (:func:`store_record`).
RECORD_KINDS = ("autotune", "simulated", "code", "sass")
_NOUNS = {
    "kernels": ("compiled kernel", "compiled kernels"), "autotune": ("autotune choice", "autotune choices"),
    "simulated": ("simulated form", "simulated forms"), "code": ("code digest record", "code digest records"),
    "sass": ("SASS listing", "SASS listings"), "launcher": ("launcher build", "launcher builds"),
    "tools": ("tool copy", "tool copies"), "profiles": ("profile report", "profile reports"),
}
#: The parts whose items name their kernel: what ``clear(kernel=...)`` looks at.
KERNEL_PARTS = ("kernels", "autotune", "simulated")
_ENTRY_NAME = re.compile(r"[0-9a-f]{40}|id-[A-Za-z0-9_.-]+")  # what _slot() names an entry's folder
_IN_USE_S = 60.0  # a hidden temporary file younger than this may be a live writer's: clear() leaves it


def describe(part: str, n: int) -> str:
    """``"3 compiled kernels"``: ``n`` items of ``part`` (:data:`PARTS`), in words."""
    return f"{n} {_NOUNS[part][n != 1]}"


def folder(part: str) -> Path:
    """The folder of ``part`` (one of :data:`PARTS` but ``"kernels"``, whose entries sit
    in the cache folder itself)."""
    if part not in PARTS or part == "kernels":
        names = ", ".join(p for p in PARTS if p != "kernels")
        raise ValueError(f"pnex cache: no folder named {part!r}; the folders are {names}")
    return cache_dir() / part


def build_lock(build_folder: Path) -> Path:
    """The lock a build into ``build_folder`` (under ``launcher/``) holds while it runs
    (:mod:`pnex_magic.launch.background`).  :func:`clear` leaves a build whose lock is
    held, and leaves the (empty) lock files: one removed under a waiting process would
    let two builds of one key run at once."""
    return build_folder.parent / f"{build_folder.name}.flock"


@dataclasses.dataclass(frozen=True)
class _Item:
    paths: tuple[Path, ...]  # what it is made of
    lock: Path | None = None  # held by whoever is making it
    kernel: str | None = None  # the kernel it is of, where it names one


def _kernel_of(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    kernel = data.get("kernel") if isinstance(data, dict) else None
    return kernel if isinstance(kernel, str) else None


def _children(where: Path) -> list[Path]:
    """``where``'s entries, sorted; none when it is not a folder, or is a link (to a
    folder that is not this cache's: the tests share one launcher build that way)."""
    if where.is_symlink() or not where.is_dir():
        return []
    try:
        return sorted(where.iterdir())
    except OSError:
        return []


def _items(part: str, kernels: bool = False) -> list[_Item]:
    """The items of ``part`` now (``kernels``: with the kernel each names, read)."""
    if part == "kernels":
        found = []
        for path in _children(cache_dir()):
            if _ENTRY_NAME.fullmatch(path.name) and (path / "meta.json").is_file():
                found.append(_Item((path,), kernel=_kernel_of(path / "meta.json") if kernels else None))
        return found
    where = folder(part)
    if part in RECORD_KINDS:
        return [_Item((p,), kernel=_kernel_of(p) if kernels else None)
                for p in _children(where) if p.suffix == ".json" and not p.name.startswith(".")]
    if part == "launcher":
        # A build's folder (<key>), its log (<key>.log), failure record (<key>.failed.json) and a
        # killed build's temporary folders (.<key>.tmp-<pid>) are one item, under its lock.
        groups: dict[str, list[Path]] = {}
        for path in _children(where):
            if path.name.endswith(".flock"):
                continue
            groups.setdefault(path.name.lstrip(".").split(".")[0], []).append(path)
        return [_Item(tuple(paths), lock=build_lock(where / stem) if build_lock(where / stem).exists() else None)
                for stem, paths in groups.items()]
    return [_Item((p,)) for p in _children(where) if not p.name.startswith(".")]


def _size(path: Path) -> int:
    try:
        if path.is_symlink() or not path.is_dir():
            return path.lstat().st_size
        total = 0
        for root, _, files in os.walk(path):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_size
        return total
    except OSError:
        return 0


@dataclasses.dataclass(frozen=True)
class Usage:
    """One part's items (see :data:`PARTS`) and their bytes."""

    items: int
    bytes: int


def usage() -> dict[str, Usage]:
    """Every part of the cache (:data:`PARTS`, in that order): its items and bytes now."""
    found = {}
    for part in PARTS:
        items = _items(part)
        found[part] = Usage(len(items), sum(_size(p) for item in items for p in item.paths))
    return found


@dataclasses.dataclass(frozen=True)
class Cleared:
    """What :func:`clear` removed: items per part (:data:`PARTS`; every part it looked
    at, zeros included), their bytes, the parts kept as asked and what it left, and why."""

    directory: Path
    removed: dict[str, int]
    bytes_freed: int = 0
    kept: tuple[str, ...] = ()
    left: tuple[str, ...] = ()  #: "<path>: why", for each item it could not or would not remove

    @property
    def total(self) -> int:
        """Items removed, all parts together."""
        return sum(self.removed.values())

    def describe(self) -> str:
        """``"3 compiled kernels, 1 autotune choice"`` (the parts it removed from), or ``"nothing"``."""
        parts = [describe(p, n) for p, n in self.removed.items() if n]
        return ", ".join(parts) or "nothing"

    def __str__(self) -> str:
        text = f"pnex cache {self.directory}: removed {self.describe()}"
        if self.kept:
            text += f"; kept {', '.join(_NOUNS[p][1] for p in self.kept)}"
        if self.left:
            text += "; left " + "; ".join(self.left)
        return text


def clear(*, keep: str | Iterable[str] = (), kernel: str | None = None) -> Cleared:
    """Remove what pnex keeps in its cache folder: every part of :data:`PARTS` (compiled
    kernels, autotune choices, the simulator's typed kernels, the code version's digests,
    SASS listings, the launcher's builds, tool copies and profile reports).  Everything
    in it is made again when next needed: kernels are compiled, choices timed, the
    launcher built (in the background, by the next process that wants it).

    ``keep``: parts to leave, e.g. ``keep="autotune"`` (choices took GPU time to make).
    ``kernel``: only the compiled kernels, autotune choices and simulated forms whose
    kernel name contains it; the other parts are left.

    Only what pnex names is removed (``$PNEX_CACHE_DIR`` may be a folder holding other
    things), and not what may be in use: a launcher build in progress (its lock held),
    a writer's temporary files younger than a minute, a part's folder that is a link
    to another folder.  Processes that already loaded a kernel or the launcher go on
    using it.  Returns what was removed, counted by part (:class:`Cleared`)."""
    keep = (keep,) if isinstance(keep, str) else tuple(keep)
    unknown = [k for k in keep if k not in PARTS]
    if unknown:
        raise ValueError(f"clear(keep=...): no part named {unknown[0]!r}; the parts are {', '.join(PARTS)}")
    root = cache_dir()
    removed: dict[str, int] = {}
    left: list[str] = []
    freed = 0
    for part in PARTS:
        if part in keep or (kernel is not None and part not in KERNEL_PARTS):
            continue
        removed[part] = 0
        if part != "kernels" and folder(part).is_symlink():
            left.append(f"{folder(part)}: a link to another folder")
            continue
        for item in _items(part, kernels=kernel is not None):
            if kernel is not None and (item.kernel is None or kernel not in item.kernel):
                continue
            size = sum(_size(p) for p in item.paths)
            failed = _remove_item(item, root, aside=part == "kernels")
            if failed is None:
                removed[part] += 1
                freed += size
            else:
                left.append(failed)
        if part != "kernels" and kernel is None:
            _remove_stale(folder(part))
            with contextlib.suppress(OSError):
                folder(part).rmdir()  # where it is empty now (launcher/ keeps its lock files)
    if kernel is None and "kernels" not in keep:
        _remove_stale(root)
    return Cleared(root, removed, freed, tuple(p for p in PARTS if p in keep), tuple(left))


def _remove_item(item: _Item, root: Path, aside: bool) -> str | None:
    """Remove ``item`` (under its lock, where it has one); ``None``, or why it was left."""
    lock_file = None
    if item.lock is not None:
        try:
            lock_file = open(item.lock, "a")  # noqa: SIM115 - closed below
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if lock_file is not None:
                lock_file.close()
            return f"{item.paths[0]}: a build in progress"
    errors: list[str] = []
    try:
        for path in item.paths:
            try:
                if path.is_symlink() or not path.is_dir():
                    path.unlink(missing_ok=True)
                    continue
                if aside:  # a compiled kernel: renamed out of sight first, so that no reader finds half of it
                    hidden = root / f"{_HIDDEN[1]}{path.name}-{uuid.uuid4().hex[:12]}"
                    os.rename(path, hidden)
                    path = hidden
                shutil.rmtree(path, onerror=lambda _f, p, exc: errors.append(f"{p}: {exc[1]}"))
            except OSError as exc:
                errors.append(f"{path}: {exc.strerror or exc}")
    finally:
        if lock_file is not None:
            lock_file.close()  # lets go of the lock
    return errors[0] if errors else None


def _remove_stale(where: Path) -> None:
    """Remove the hidden temporary files and folders in ``where`` that no live writer
    can be using (older than :data:`_IN_USE_S`)."""
    now = time.time()
    for path in _children(where):
        if not path.name.startswith(_HIDDEN):
            continue
        with contextlib.suppress(OSError):
            if now - path.lstat().st_mtime > _IN_USE_S:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink()
