"""SASS: the machine code ptxas made of a kernel's cubin, disassembled by
``cuobjdump`` (or ``nvdisasm``) from the CUDA toolkit or NVIDIA's pip wheels.

A compile-stage inspection: the report gathers it next to the PTX and the
resource figures.  A cubin holds the kernel and the helper functions it calls
(``__cuda_sm20_rcp_rn_f32_slowpath`` for a division, say), which the disassembler
lists in the cubin's order; :meth:`Disassembly.kernel_first` puts the kernel's own
function first.  Where no disassembler is installed, :class:`Disassembly` says why
and what to install.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading

from . import cache
from .codeversion import code_version

__all__ = [
    "Disassembly", "PendingDisassembly", "disassemble", "find_disassembler", "tidy_sass", "SASS_ADVICE", "functions",
    "NO_DISASSEMBLER",
]

# Where each function's listing starts: cuobjdump's "Function : NAME" lines, nvdisasm's
# ".section .text.NAME" lines.
_FUNCTION_START = re.compile(r"^[ \t]*(?:Function : (\S+)|\.section[ \t]+\.text\.([^,\s]+))", re.MULTILINE)


def functions(text: str) -> tuple[str, ...]:
    """The functions of a SASS listing, in its order."""
    return tuple(m.group(1) or m.group(2) for m in _FUNCTION_START.finditer(text))


def _kernel_first(text: str, entry: str) -> str:
    """``text`` with the listing of function ``entry`` moved before the other
    functions' (the lines before the first function, the target's header, stay first)."""
    starts = list(_FUNCTION_START.finditer(text))
    names = [m.group(1) or m.group(2) for m in starts]
    if entry not in names or names[0] == entry:
        return text
    bounds = [text.rfind("\n", 0, m.start()) + 1 for m in starts] + [len(text)]
    blocks = [text[bounds[i]:bounds[i + 1]] for i in range(len(starts))]
    first = names.index(entry)
    ordered = [blocks[first]] + blocks[:first] + blocks[first + 1:]
    if not ordered[0].endswith("\n"):  # the kernel was last: no newline after its block
        ordered[0] += "\n"
        ordered[-1] = ordered[-1].rstrip("\n")
    return text[:bounds[0]] + "".join(ordered)


@dataclasses.dataclass(frozen=True)
class Disassembly:
    """SASS of a cubin, or why there is none."""

    text: str | None
    tool: str | None
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.text)

    @property
    def functions(self) -> tuple[str, ...]:
        """The functions listed, in order (the kernel first after :meth:`kernel_first`)."""
        return functions(self.text or "")

    @property
    def line_count(self) -> int:
        return len((self.text or "").splitlines())

    def kernel_first(self, entry: str) -> Disassembly:
        """The same listing with the kernel ``entry``'s function first."""
        if not self.text or not entry:
            return self
        return dataclasses.replace(self, text=_kernel_first(self.text, entry))


@dataclasses.dataclass(frozen=True)
class PendingDisassembly(Disassembly):
    """A listing still being made (the ``%%pnex`` cell shows its report before the
    disassembler, 0.2-0.5 s to start, is done; :func:`prefetch` started it): falsy,
    with a note; :meth:`result` waits for the listing."""

    NOTE = "being disassembled; the listing appears here in a moment"
    cubin: bytes = dataclasses.field(default=b"", repr=False, compare=False)
    entry: str = ""  #: the kernel's function, listed first
    use_cache: bool = True  #: whether the listing may be read from and kept in the cache folder

    def result(self) -> Disassembly:
        return disassemble(self.cubin, entry=self.entry, use_cache=self.use_cache)


def find_disassembler() -> tuple[str, str] | None:
    """``(tool, path)`` of ``cuobjdump`` or ``nvdisasm``: on PATH, in the NVIDIA pip
    wheels (``cuda.pathfinder``, then any ``site-packages/nvidia/*/bin``), or under
    ``$CUDA_HOME``/``$CUDA_PATH``/``/usr/local/cuda``."""
    import glob
    import site
    import sys

    roots = [p for p in dict.fromkeys([*site.getsitepackages(), site.getusersitepackages(), *sys.path]) if p]
    for tool in ("cuobjdump", "nvdisasm"):
        path = shutil.which(tool)
        if not path:
            try:
                from cuda.pathfinder import find_nvidia_binary_utility

                path = find_nvidia_binary_utility(tool)
            except Exception:
                path = None
        if not path:
            for root in roots:
                hits = sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", tool)))
                if hits and os.access(hits[-1], os.X_OK):
                    path = hits[-1]
                    break
        if not path:
            for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
                if root and os.access(os.path.join(root, "bin", tool), os.X_OK):
                    path = os.path.join(root, "bin", tool)
                    break
        if path:
            return tool, path
    return None


#: How a missing disassembler's reason starts.
NO_DISASSEMBLER = "neither cuobjdump nor nvdisasm was found"

SASS_ADVICE = (
    'pip install "nvidia-cuda-cuobjdump==13.*" "nvidia-cuda-nvdisasm==13.*" (the CUDA 13 disassemblers, '
    "which read the cubins of CUDA 12 builds too), or put a CUDA toolkit's bin/ on PATH"
)

_ENCODING_LINE = re.compile(r"^\s*/\* 0x[0-9a-f]{16} \*/\s*$", re.MULTILINE)
_ENCODING_TAIL = re.compile(r"\s*/\* 0x[0-9a-f]{16} \*/[ \t]*$", re.MULTILINE)


def tidy_sass(text: str) -> str:
    """Drop ``cuobjdump``'s instruction encodings (a hex comment after every
    instruction and a line of its own after it), keeping offsets and code."""
    text = _ENCODING_LINE.sub("", text)
    text = _ENCODING_TAIL.sub("", text)
    return re.sub(r"\n{2,}(?=\s*/\*[0-9a-f]{4}\*/)", "\n", text)


def disassemble(cubin: bytes | None, *, entry: str = "", timeout: float = 60.0, use_cache: bool = True) -> Disassembly:
    """SASS of ``cubin`` via ``cuobjdump -sass`` (or ``nvdisasm -c``), the function
    ``entry`` (the kernel's) first.  The listing is kept in the cache folder (``sass/``)
    for the next process, unless ``use_cache`` is false (a kernel whose options turn
    the cache off)."""
    if cubin is None:
        return Disassembly(None, None, "no cubin: nvJitLink was not available to assemble the PTX")
    digest = hashlib.sha256(cubin).hexdigest()
    with _pending_lock:
        running = _pending.get(digest)
    if running is not None:  # started by prefetch(): its result lands in the memo below
        running.join(timeout)
    return _disassemble_cached(digest, cubin, timeout, use_cache).kernel_first(entry)


_pending: dict[str, threading.Thread] = {}
_pending_lock = threading.Lock()


def prefetch(cubin: bytes | None, *, timeout: float = 60.0, use_cache: bool = True) -> None:
    """Start disassembling ``cubin`` in a background thread, so that a later
    :func:`disassemble` of it finds the listing made (the tool takes 0.2-0.5 s to
    start, time the caller spends registering the op and running it meanwhile)."""
    if cubin is None or find_disassembler() is None:
        return
    digest = hashlib.sha256(cubin).hexdigest()

    def run() -> None:
        try:
            _disassemble_cached(digest, cubin, timeout, use_cache)
        except Exception:  # noqa: BLE001  (the foreground call reports the failure)
            pass
        finally:
            with _pending_lock:
                _pending.pop(digest, None)

    with _pending_lock:
        if digest in _pending:
            return
        thread = threading.Thread(target=run, name="pnex-sass", daemon=True)
        _pending[digest] = thread
    thread.start()


_RECORD_KIND = "sass"


@functools.lru_cache(maxsize=32)
def _disassemble_cached(digest: str, cubin: bytes, timeout: float, use_cache: bool = True) -> Disassembly:
    found = find_disassembler()
    if found is None:
        return Disassembly(None, None, f"{NO_DISASSEMBLER}: {SASS_ADVICE}")
    tool, path = found
    # The disassembler takes 0.2-0.5 s even for a tiny cubin: its listing is kept in the
    # cache folder, keyed by the cubin, the tool and the code that tidies its output, for
    # the next process (a re-run cell).
    version = code_version(use_cache=use_cache)
    key = hashlib.sha256(f"{digest}|{tool}|{os.path.realpath(path)}|{version}".encode()).hexdigest()
    stored = cache.load_record(_RECORD_KIND, key) if use_cache else None
    if stored is not None and isinstance(stored.get("text"), str):
        return Disassembly(stored["text"], tool, "")
    result = _run_disassembler(tool, path, cubin, timeout)
    if result.text and use_cache:
        cache.store_record(_RECORD_KIND, key, {"text": result.text, "tool": tool})
    return result


def _run_disassembler(tool: str, path: str, cubin: bytes, timeout: float) -> Disassembly:
    with tempfile.TemporaryDirectory(prefix="pnex-sass-") as tmp:
        file = os.path.join(tmp, "kernel.cubin")
        with open(file, "wb") as f:
            f.write(cubin)
        argv = [path, "-sass", file] if tool == "cuobjdump" else [path, "-c", file]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Disassembly(None, tool, f"{tool} could not run: {exc}")
    if done.returncode != 0 or not done.stdout.strip():
        err = (done.stderr or done.stdout).strip().splitlines()
        return Disassembly(None, tool, f"{tool} failed ({err[-1] if err else f'exit {done.returncode}'}); "
                                       f"it may be older than the cubin's architecture")
    return Disassembly(tidy_sass(done.stdout), tool, "")
