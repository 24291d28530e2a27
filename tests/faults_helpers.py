"""What the fault matrix's tests share (tests/test_faults.py, test_faults_builds.py,
test_faults_folders_memory.py): a script written to a file, an environment with a cache folder,
the RESULT lines a subprocess printed, the check that every cache entry is whole, and the small
C++ extension built as the launcher is."""

from __future__ import annotations

import json
from pathlib import Path

from pnex_magic import cache


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _env(pnex_env: dict, cache_folder: Path) -> dict:
    return dict(pnex_env, PNEX_CACHE_DIR=str(cache_folder))


def _results(stdout: str) -> list[dict]:
    return [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]


def _check_whole_entries(folder: Path) -> list[cache.CacheEntry]:
    """Every visible entry of ``folder`` is whole: meta.json names its key and every
    file it lists is there.  Returns them."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name in cache.PARTS:  # not entries: the other parts of the cache
            continue
        meta = json.loads((path / "meta.json").read_text())
        assert len(meta["key"]) == 64, path
        for name in meta["files"]:
            assert (path / name).is_file() and (path / name).stat().st_size > 0, (path, name)
        found.append(cache.CacheEntry(path, meta))
    return found


# Built by the same code as the launcher (torch's cpp_extension and ninja under pnex's
# lock), but small: pybind11 alone compiles in seconds where torch's headers take a minute.
PROBE_SOURCE = """
#include <pybind11/pybind11.h>
int add(int a, int b) { return a + b; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add", &add); }
"""
