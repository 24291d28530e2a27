"""Capture everything printed while a kernel compiles, down to the file
descriptors: NVVM and ptxas write to fds 1 and 2 directly, which in a Jupyter
kernel would land in the server's terminal instead of the notebook.  The
``%%pnex`` magic shows what was captured folded under the cell (as Cython's magic
does), and attaches it to a failing cell's exception."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

__all__ = ["Captured", "capture_output"]


@dataclasses.dataclass
class Captured:
    """Text captured by :func:`capture_output` (filled in when the block exits)."""

    text: str = ""


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


@contextlib.contextmanager
def capture_output() -> Iterator[Captured]:
    """Capture everything printed inside the block: by Python (``sys.stdout``,
    ``sys.stderr``, warnings, logging's last-resort handler) and by native
    libraries writing to file descriptors 1 and 2 (NVVM, ptxas), which in a Jupyter
    kernel would otherwise land in the server's terminal."""
    captured = Captured()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    tmp = tempfile.TemporaryFile()
    saved: list[tuple[int, int]] = []
    for fd in (1, 2):
        try:
            saved.append((fd, os.dup(fd)))
            os.dup2(tmp.fileno(), fd)
        except OSError:
            pass
    out, err = io.StringIO(), io.StringIO()
    caught: list[warnings.WarningMessage] = []
    # pnex's own log records (e.g. "not compiled: no NVVM") go into the capture too.
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package_log = logging.getLogger("pnex_magic")
    package_log.addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield captured
    finally:
        package_log.removeHandler(handler)
        _flush_c_stdio()
        for fd, dup in saved:
            os.dup2(dup, fd)
            os.close(dup)
        tmp.seek(0)
        native = tmp.read().decode("utf-8", "replace")
        tmp.close()
        parts = [out.getvalue(), err.getvalue(), native]
        parts += [f"{w.category.__name__}: {w.message}" for w in caught or ()]
        captured.text = "\n".join(p.rstrip("\n") for p in parts if p and p.strip())
