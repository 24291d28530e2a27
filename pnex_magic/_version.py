"""The package version (one place; the cache key and the doctor read it), and the
installed versions of other distributions, read without importing them."""

from __future__ import annotations

import functools
import os
import re
import sys

__version__ = "0.1.0"

__all__ = ["__version__", "installed_versions"]


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@functools.lru_cache(maxsize=1)
def _installed() -> dict[str, str]:
    """Every distribution found on ``sys.path`` (first one wins, as for imports), by
    normalised name: read from the names of the ``.dist-info`` / ``.egg-info``
    folders, one directory listing per path entry.  ``importlib.metadata`` would give
    the same answers at about 60 ms for its import and a few ms per name; this takes
    a fraction of a millisecond, which matters on the path of a compile-cache hit."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for item in names:
            if item.endswith(".dist-info"):
                stem = item[: -len(".dist-info")]
            elif item.endswith(".egg-info"):
                stem = item[: -len(".egg-info")]
            else:
                continue
            name, sep, version = stem.partition("-")
            if not sep:
                continue
            found.setdefault(_normalise(name), version.split("-")[0])
    return found


def installed_versions(*dists: str) -> dict[str, str | None]:
    """``{dist: version or None}`` for the distributions named (any spelling:
    ``numba-cuda``, ``numba_cuda``), as installed on ``sys.path`` when first asked."""
    found = _installed()
    return {dist: found.get(_normalise(dist)) for dist in dists}
