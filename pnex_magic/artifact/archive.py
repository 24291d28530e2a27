"""The container of a saved artifact: one zip file holding ``manifest.json`` and the
files it lists (PTX and cubins), each with its SHA-256 and size.

Reading checks, in this order, that the file is a zip, that it holds a manifest
which is a JSON object of the pnex artifact format, that its format version is one
this pnex_magic reads (a newer one is refused, naming both versions), and that
every listed file is present, intact (zip CRC, size, SHA-256) and of the listed
size; every failure is one :class:`~pnex_magic.errors.ArtifactError`.  Given the
file's expected SHA-256, reading first checks the whole file against it.  Nothing in
the file is ever executed: the manifest is JSON, the rest is bytes handed to the
CUDA driver.  Writing goes through a temporary file renamed into place, so a
killed process never leaves half an artifact under the name.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import ArtifactError

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "write_archive", "read_archive"]

FORMAT = "pnex_magic kernel artifact"
#: The artifact format this pnex_magic writes; it reads this one and older ones.
#: 2: the launch description holds the InMut memory checks; a scalar parameter may
#: have a "default", an InMut a "may_alias" list.
#: 3: "tune" parameters with their "choices"; code per Tune variant ("tune_layouts");
#: launch candidates name their variant.
#: 4: the spec's "shared_bytes" (dynamic shared memory per block, an expression over
#: Tune parameters) and the launch description's "shared" (its bytes per Tune variant).
#: 5: the spec's "requires" (jit(requires=...)) and the launch description's rules: an
#: older reader would launch what the rules refuse, so it must refuse the file.
#: 6: the spec's "tune_requires" (jit(tune_requires=...)): the variants are the
#: combinations of Tune choices that keep them, which an older reader would number otherwise.
#: 7: "tune_requires" rules that name the call's arguments: each call launches only the
#: variants they keep for it (the key and the rules of the launch description), which an
#: older reader would refuse as a rule over a non-Tune name.
FORMAT_VERSION = 7
MANIFEST = "manifest.json"
# Generous bounds that keep a damaged or hostile file from exhausting memory.
_MAX_MANIFEST_BYTES = 16 << 20
_MAX_FILE_BYTES = 512 << 20


def write_archive(path: str | os.PathLike, manifest: dict[str, Any], files: Mapping[str, bytes]) -> Path:
    """Write ``manifest`` (plus the format fields and the files' checksums) and
    ``files`` to the zip file ``path``; returns the path."""
    path = Path(path)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "pnex_magic": __version__,
        **manifest,
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)} for name, data in files.items()},
    }
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
            for name, data in files.items():
                zf.writestr(name, data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _expected_digest(sha256: Any) -> str:
    digest = sha256.strip().lower() if isinstance(sha256, str) else None
    if digest is None or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ArtifactError(
            f"pnex.load(sha256=...) takes the file's SHA-256 as 64 hexadecimal digits (what sha256sum prints, or "
            f"hashlib.sha256(data).hexdigest()), got {sha256!r}"
        )
    return digest


def _corrupt(path: Path, problem: str) -> ArtifactError:
    return ArtifactError(f"{path} is not a usable pnex artifact: {problem}")


def _member(zf: zipfile.ZipFile, path: Path, name: str, limit: int) -> bytes:
    try:
        info = zf.getinfo(name)
    except KeyError:
        raise _corrupt(path, f"it has no {name!r} (truncated or not written by pnex_magic.save)") from None
    if info.file_size > limit:
        raise _corrupt(path, f"{name!r} claims {info.file_size} bytes, more than an artifact holds")
    try:
        return zf.read(info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        raise _corrupt(path, f"{name!r} cannot be read ({type(exc).__name__}: {exc}); the file is damaged") from None
    except Exception as exc:  # zlib.error and other decompressor failures
        raise _corrupt(path, f"{name!r} cannot be decompressed ({type(exc).__name__}: {exc})") from None


def _check_format(path: Path, manifest: Any) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _corrupt(path, f"its {MANIFEST} is not a pnex artifact manifest")
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _corrupt(path, f"its format version is {version!r}, not a positive integer")
    if version > FORMAT_VERSION:
        writer = manifest.get("pnex_magic")
        by = f" (written by pnex_magic {writer})" if isinstance(writer, str) else ""
        raise ArtifactError(
            f"{path} is in pnex artifact format version {version}{by}, but this pnex_magic ({__version__}) "
            f"reads format version {FORMAT_VERSION} and older: upgrade pnex_magic to load it"
        )


def read_archive(path: str | os.PathLike, *, sha256: str | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and every file it lists, checked (see the module docstring).  With
    ``sha256`` (64 hexadecimal digits), the whole file must have that SHA-256 first: it
    is read once, hashed and opened from memory, so what was checked is what is read."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such artifact file" + (" (it is a folder)" if path.is_dir() else ""))
    source: Path | io.BytesIO = path
    if sha256 is not None:
        expected = _expected_digest(sha256)
        data = path.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise ArtifactError(
                f"{path}: its SHA-256 is {actual}, not the expected {expected}; refusing to load it. The file "
                f"was altered, damaged or replaced (an artifact carries GPU code: load only files you trust)"
            )
        source = io.BytesIO(data)
    try:
        zf = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        raise _corrupt(path, f"it is not a zip file, or a truncated one ({exc})") from None
    with zf:
        raw = _member(zf, path, MANIFEST, _MAX_MANIFEST_BYTES)
        try:
            manifest = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise _corrupt(path, f"its {MANIFEST} is not valid JSON ({exc})") from None
        _check_format(path, manifest)
        listed = manifest.get("files")
        if not isinstance(listed, dict):
            raise _corrupt(path, f"its {MANIFEST} lists no files")
        files: dict[str, bytes] = {}
        for name, info in listed.items():
            if not isinstance(info, dict) or not isinstance(info.get("sha256"), str) or not isinstance(info.get("size"), int):
                raise _corrupt(path, f"its {MANIFEST} describes {name!r} without a checksum and size")
            data = _member(zf, path, name, _MAX_FILE_BYTES)
            if len(data) != info["size"] or hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise _corrupt(path, f"{name!r} does not match its checksum; the file was damaged or altered")
            files[name] = data
    return manifest, files
