"""``%%pnex --sanitize``: run an op once under NVIDIA's ``compute-sanitizer``, in a
child process, and map what it finds to the kernel's Python lines.

The notebook's own CUDA context is never touched: the parent saves the op
(:func:`pnex_magic.save`, a cubin for the GPU's architecture) and the example
arguments (``torch.save``) in a temporary folder, and each tool runs
``python -m pnex_magic._sanitize_child FOLDER`` (which loads both, calls the op
once and synchronises) under ``compute-sanitizer --tool TOOL``.  Only the pnex
kernel is checked (``--kernel-name kne=<its entry>``), not PyTorch's own kernels.

Tools: ``memcheck`` always (accesses out of bounds, misaligned, to freed memory);
``racecheck`` and ``synccheck`` when the kernel uses shared memory (races between
threads of a block; ``cuda.syncthreads()`` in divergent code); ``initcheck`` (reads
of memory nothing wrote).  With line information in the cubin (``-lineinfo``),
compute-sanitizer names the file and line of each access (``at FUNC+0x90 in
FILE:LINE``); a finding whose file is the kernel's gets the Python line's text.

``compute-sanitizer`` comes with every CUDA toolkit (``$CUDA_HOME/bin``,
``/usr/local/cuda/bin``) and as NVIDIA's pip wheels: ``nvidia-cuda-sanitizer-api``
(CUDA 13; ``nvidia/cu13/bin/compute-sanitizer``) and
``nvidia-cuda-sanitizer-api-cu12`` (CUDA 12;
``nvidia/cuda_sanitizer_api/bin/compute-sanitizer``, shipped without its executable
bit, which pnex does not change: it runs a copy in its own cache folder).
"""

from __future__ import annotations

import dataclasses
import glob
import html
import linecache
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import cache
from .artifact import save
from .tc.tensormap import maps_among  # tensor maps hold addresses: the child makes them again
from .errors import PnexError

__all__ = [
    "SANITIZER_ADVICE",
    "TOOLS",
    "Finding",
    "SanitizerReport",
    "find_sanitizer",
    "default_tools",
    "parse_output",
    "run_sanitizer",
]

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")

SANITIZER_ADVICE = (
    'no compute-sanitizer was found (on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin, or NVIDIA\'s pip wheel). '
    'Install it with pip install "nvidia-cuda-sanitizer-api==13.*" for a CUDA 13 driver (580 or newer), or '
    'pip install "nvidia-cuda-sanitizer-api-cu12==12.*" for a CUDA 12 driver, or put a CUDA toolkit\'s bin/ on PATH'
)

# Where NVIDIA's pip wheels put it, under site-packages.
_WHEEL_PATHS = ("nvidia/cu13/bin/compute-sanitizer", "nvidia/cuda_sanitizer_api/bin/compute-sanitizer")


def _site_roots() -> list[str]:
    import site

    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    return [r for r in dict.fromkeys(roots) if r and os.path.isdir(r)]


def _runnable(path: str) -> str | None:
    """``path`` if it can be run; a wheel's executable without its executable bit is
    copied (with its folder, which holds the libraries it loads) into pnex's cache."""
    if os.access(path, os.X_OK):
        return path
    if not os.path.isfile(path):
        return None
    source = Path(path).resolve().parent
    target = cache.folder("tools") / source.parent.name / source.name
    copied = target / Path(path).name
    if not copied.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target, dirs_exist_ok=True)
        # The cu12 wheel's binary finds its libraries in ../lib.
        libs = source.parent / "lib"
        if libs.is_dir():
            shutil.copytree(libs, target.parent / "lib", dirs_exist_ok=True)
    copied.chmod(copied.stat().st_mode | stat.S_IXUSR)
    return str(copied)


def find_sanitizer() -> Path:
    """The ``compute-sanitizer`` executable: on ``$PATH``, in ``$CUDA_HOME/bin``
    (``$CUDA_PATH``), ``/usr/local/cuda/bin``, or NVIDIA's pip wheel.

    Raises
    ------
    PnexError
        None is installed; the message says what to install.
    """
    found = shutil.which("compute-sanitizer")
    if found:
        return Path(found)
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            path = _runnable(os.path.join(root, "bin", "compute-sanitizer"))
            if path:
                return Path(path)
    for root in _site_roots():
        for rel in _WHEEL_PATHS:
            for hit in sorted(glob.glob(os.path.join(root, rel))):
                path = _runnable(hit)
                if path:
                    return Path(path)
    raise PnexError(SANITIZER_ADVICE)


# ----------------------------------------------------------------------------- parsing


@dataclasses.dataclass(frozen=True)
class Finding:
    """One report of a tool, with where it points in the kernel's Python source."""

    tool: str
    kind: str  #: e.g. "Invalid __global__ write of size 4 bytes", "Race between Write and Read (512 hazards)"
    severity: str = "error"  #: "error" or "warning"
    function: str = ""  #: the device function as compute-sanitizer names it
    file: str | None = None
    line: int | None = None
    thread: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    address: str | None = None
    details: tuple[str, ...] = ()  #: the record's other lines ("Address 0x... is out of bounds", ...)
    other_file: str | None = None  #: a race's second access
    other_line: int | None = None
    source_text: str | None = None  #: the kernel's line ``line``, when ``file`` is the kernel's
    other_source_text: str | None = None

    @property
    def python_line(self) -> int | None:
        """``line`` when it is a line of the kernel's source (else ``None``)."""
        return self.line if self.source_text is not None else None

    def summary(self) -> str:
        where = ""
        if self.line is not None:
            where = f" at line {self.line}" + (f": `{self.source_text}`" if self.source_text else f" of {self.file}")
        if self.other_line is not None:
            where += f", and line {self.other_line}" + (f": `{self.other_source_text}`" if self.other_source_text else "")
        who = ""
        if self.thread is not None:
            who = f", thread {self.thread}" + (f" of block {self.block}" if self.block is not None else "")
        elif self.block is not None:
            who = f", block {self.block}"
        extra = f" ({self.details[0]})" if self.details else ""
        return f"{self.tool}: {self.kind}{where}{who}{extra}"


_PREFIX = re.compile(r"^\s*=========(?: |$)")
_AT = re.compile(r"^at (?P<func>.+?)(?:\+0x[0-9a-fA-F]+)?(?: in (?P<file>.+):(?P<line>\d+))?$")
_BY_THREAD = re.compile(r"^by thread \((\d+),\s*(\d+),\s*(\d+)\) in block \((\d+),\s*(\d+),\s*(\d+)\)")
_ADDRESS = re.compile(r"^Address (0x[0-9a-fA-F]+)")
_RACE = re.compile(
    r"^(?P<sev>Error|ERROR|Warning|WARNING): Race reported between (?P<a>\w+) access at (?P<loc>.+)$"
)
_RACE_OTHER = re.compile(r"^and (?P<b>\w+) access at (?P<loc>.+?)(?: \[(?P<n>[\d,]+) hazards?\])?$")
_HAZARD = re.compile(
    r"^(?P<sev>Error|ERROR|Warning|WARNING):(?: \(.*?\))? Potential (?P<kind>\w+) hazard detected at "
    r"(?P<space>\S+) (?P<addr>0x[0-9a-fA-F]+) in block \((\d+),\s*(\d+),\s*(\d+)\)"
)
_HAZARD_THREAD = re.compile(r"^(?P<access>\w+) Thread \((\d+),\s*(\d+),\s*(\d+)\) at (?P<loc>.+)$")
_LOC = re.compile(r"^(?P<func>.+?)(?:\+0x[0-9a-fA-F]+)?(?: in (?P<file>.+):(?P<line>\d+))?$")
_DEVICE_FRAME = re.compile(r"^Device Frame:\s*(?P<loc>.+)$")
_CONSEQUENCE = re.compile(r"^Program hit .*(launch failure|illegal|error 719|error 700)")
_SKIP = re.compile(
    r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned|"
    r"Error: process didn't terminate|Saved host backtrace|Host Frame)"
)


def _records(text: str) -> list[list[str]]:
    """compute-sanitizer's lines grouped into records: a record starts with a line not
    indented after the ``========= `` prefix; its details are indented."""
    records: list[list[str]] = []
    current: list[str] | None = None
    for raw in text.splitlines():
        if not _PREFIX.match(raw):
            continue  # the program's own output
        body = _PREFIX.sub("", raw, count=1).rstrip()
        if not body.strip():
            current = None
            continue
        if body.startswith(" ") and current is not None:
            current.append(body.strip())
            continue
        body = body.strip()
        if body.startswith(" ") or _SKIP.match(body):
            current = None
            continue
        current = [body]
        records.append(current)
    return records


def _loc(text: str) -> tuple[str, str | None, int | None]:
    m = _LOC.match(text.strip())
    if m is None:
        return text.strip(), None, None
    return m.group("func"), m.group("file"), int(m.group("line")) if m.group("line") else None


def parse_output(text: str, tool: str) -> list[Finding]:
    """The findings in one compute-sanitizer log (its text output) of ``tool``."""
    findings = []
    for record in _records(text):
        head, rest = record[0], record[1:]
        race = _RACE.match(head)
        hazard = _HAZARD.match(head)
        if race:
            func, file, line = _loc(race.group("loc"))
            kind, other_file, other_line = f"Race reported between {race.group('a')} access", None, None
            for detail in rest:
                m = _RACE_OTHER.match(detail)
                if m:
                    _, other_file, other_line = _loc(m.group("loc"))
                    kind += f" and {m.group('b')} access"
                    if m.group("n"):
                        kind += f" ({m.group('n')} hazards)"
            findings.append(Finding(tool, kind, race.group("sev").lower(), func, file, line,
                                    other_file=other_file, other_line=other_line, details=tuple(rest)))
            continue
        if hazard:
            block = tuple(int(hazard.group(i)) for i in (5, 6, 7))
            locs = [_HAZARD_THREAD.match(d) for d in rest]
            locs = [m for m in locs if m]
            func, file, line = _loc(locs[0].group("loc")) if locs else ("", None, None)
            thread = tuple(int(locs[0].group(i)) for i in (2, 3, 4)) if locs else None
            other_file = other_line = None
            if len(locs) > 1:
                _, other_file, other_line = _loc(locs[1].group("loc"))
            findings.append(Finding(
                tool, f"Potential {hazard.group('kind')} hazard at {hazard.group('space')}", hazard.group("sev").lower(),
                func, file, line, thread, block, hazard.group("addr"), tuple(rest), other_file, other_line,
            ))
            continue
        func, file, line, thread, block, address, details = "", None, None, None, None, None, []
        for detail in rest:
            at, by, addr, frame = _AT.match(detail), _BY_THREAD.match(detail), _ADDRESS.match(detail), \
                _DEVICE_FRAME.match(detail)
            if at and not func:
                func = at.group("func")
                file = at.group("file")
                line = int(at.group("line")) if at.group("line") else None
            elif by:
                nums = [int(by.group(i)) for i in range(1, 7)]
                thread, block = tuple(nums[:3]), tuple(nums[3:])
            elif frame:
                details.append(detail)
            else:
                if addr:
                    address = addr.group(1)
                details.append(detail)
        # Barrier reports put the location on the first line: "... at FUNC+0x2b0 in app.cu:36".
        if not func and " at " in head:
            tail = head.rsplit(" at ", 1)[1]
            func, file, line = _loc(tail)
        severity = "warning" if head.lower().startswith("warning") else "error"
        findings.append(Finding(tool, head, severity, func, file, line, thread, block, address, tuple(details)))
    if any(f.thread is not None or f.line is not None for f in findings):
        # The failed calls that follow a kernel's memory error say nothing more.
        findings = [f for f in findings if not _CONSEQUENCE.match(f.kind)]
    return findings


def _frames(finding: Finding) -> list[tuple[str | None, int | None]]:
    frames = [(finding.file, finding.line)]
    for detail in finding.details:
        m = _DEVICE_FRAME.match(detail)
        if m:
            _, file, line = _loc(m.group("loc"))
            frames.append((file, line))
    return frames


def map_to_source(finding: Finding, filename: str, first: int, last: int) -> Finding:
    """``finding`` with its line (or, for an access inlined from elsewhere, the first
    device frame's line) in the kernel's source ``filename`` (lines ``first`` to
    ``last``) and that line's text."""

    def same(file: str | None) -> bool:
        if not file:
            return False
        return file == filename or os.path.basename(file) == os.path.basename(filename)

    def text(line: int | None) -> str | None:
        if line is None or not first <= line <= last:
            return None
        return linecache.getline(filename, line).strip() or None

    for file, line in _frames(finding):
        if same(file) and text(line) is not None:
            other = text(finding.other_line) if same(finding.other_file) else None
            return dataclasses.replace(finding, file=file, line=line, source_text=text(line), other_source_text=other)
    return finding


# ----------------------------------------------------------------------------- report


@dataclasses.dataclass(frozen=True)
class SanitizerReport:
    """What compute-sanitizer found in one run of an op.

    ``findings`` holds every report, in the order of ``tools``; ``logs`` the raw
    output per tool, ``child_output`` what the child process printed per tool,
    ``returncodes`` its exit status per tool (a kernel that faulted under memcheck
    makes the child fail: that is a finding, not an error of the run)."""

    kernel: str
    sanitizer: str
    tools: tuple[str, ...]
    findings: tuple[Finding, ...]
    logs: dict[str, str]
    child_output: dict[str, str]
    returncodes: dict[str, int]

    @property
    def ok(self) -> bool:
        """No tool found anything."""
        return not self.findings

    def by_tool(self, tool: str) -> list[Finding]:
        return [f for f in self.findings if f.tool == tool]

    def __str__(self) -> str:
        tools = ", ".join(self.tools)
        if self.ok:
            return f"compute-sanitizer found no errors in {self.kernel}() ({tools})"
        lines = [f"compute-sanitizer found {len(self.findings)} problem(s) in {self.kernel}() ({tools}):"]
        lines += [f"  {f.summary()}" for f in self.findings]
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self) if not cycle else "SanitizerReport(...)")

    def _repr_html_(self) -> str:
        e = html.escape
        tools = e(", ".join(self.tools))
        if self.ok:
            return f"<div class='pnex-sanitize'>compute-sanitizer found no errors in <code>{e(self.kernel)}()</code> ({tools})</div>"
        rows = "".join(
            f"<tr><td>{e(f.tool)}</td><td>{e(f.kind)}</td>"
            f"<td>{e(str(f.line) if f.line is not None else '')}</td>"
            f"<td><code>{e(f.source_text or '')}</code></td>"
            f"<td>{e(str(f.thread) if f.thread else '')}</td><td>{e(str(f.block) if f.block else '')}</td></tr>"
            for f in self.findings
        )
        return (
            f"<div class='pnex-sanitize'><p>compute-sanitizer found {len(self.findings)} problem(s) in "
            f"<code>{e(self.kernel)}()</code> ({tools})</p><table><tr><th>tool</th><th>what</th><th>line</th>"
            f"<th>source</th><th>thread</th><th>block</th></tr>{rows}</table></div>"
        )


def default_tools(definition: Any, arch: str) -> tuple[str, ...]:
    """memcheck and initcheck; racecheck and synccheck too when the kernel uses shared
    memory (or its resources are unknown)."""
    shared = None
    try:
        resources = definition.compiled(arch).resources
        shared = None if resources is None else resources.shared_bytes
    except Exception:
        shared = None
    if shared == 0 and not any(definition.spec.shared_per_variant):  # no static nor dynamic shared memory
        return ("memcheck", "initcheck")
    return ("memcheck", "racecheck", "synccheck", "initcheck")


def _child_env() -> dict[str, str]:
    """The environment of the child: this one, with pnex_magic importable from where
    this process imports it."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.pop("PYTHONOPTIMIZE", None)
    # Every tensor its own cudaMalloc: memcheck sees an allocation's real end, not that
    # of the caching allocator's segment.
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def _arch_of(args: Sequence[Any]) -> str:
    import torch

    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
    if device is None:
        raise PnexError(
            "--sanitize runs the op on the GPU: the example arguments (--args) hold no CUDA tensor"
        )
    return "sm_%d%d" % torch.cuda.get_device_capability(device)


def run_sanitizer(
    op: Any, args: Sequence[Any], tools: Sequence[str] | None = None, *, timeout: float = 600.0,
    arch: str | None = None,
) -> SanitizerReport:
    """Run ``op(*args)`` once under each of ``tools`` (default :func:`default_tools`)
    in a child process, and report what compute-sanitizer found.

    Parameters
    ----------
    op : PnexOp
        An op made by ``pnex.jit`` or ``%%pnex``; it is saved (``pnex.save``) for the child.
    args : sequence
        The op's arguments (CUDA tensors, scalars), as for a call.
    tools : sequence of str, optional
        Among ``memcheck``, ``racecheck``, ``synccheck``, ``initcheck``.
    timeout : float
        Seconds per tool.
    arch : str, optional
        The GPU's architecture (default: that of the first CUDA tensor in ``args``).

    Raises
    ------
    PnexError
        No compute-sanitizer is installed, an unknown tool, or the op cannot be saved.
    """
    import torch

    sanitizer = find_sanitizer()
    definition = getattr(op, "_pnex", None) or getattr(op, "definition", None)
    if definition is None:
        raise PnexError(f"--sanitize runs a pnex op, got {op!r}")
    spec = definition.spec
    arch = arch or _arch_of(args)
    tools = tuple(tools) if tools is not None else default_tools(definition, arch)
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise PnexError(f"unknown compute-sanitizer tool(s) {unknown}: choose among {', '.join(TOOLS)}")
    entry = definition.compiled(arch).entry
    fn = getattr(definition, "fn", None)
    logs: dict[str, str] = {}
    outputs: dict[str, str] = {}
    codes: dict[str, int] = {}
    findings: list[Finding] = []
    with tempfile.TemporaryDirectory(prefix="pnex-sanitize-") as tmp:
        folder = Path(tmp)
        save(op, folder / "kernel.pnex", archs=[arch])
        values = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
        torch.save({"args": values, "cuda": [isinstance(a, torch.Tensor) and a.is_cuda for a in args],
                    "maps": maps_among(args)}, folder / "args.pt")
        for tool in tools:
            log = folder / f"{tool}.log"
            # --report-api-errors no: the driver calls that fail by design (an optional entry point
            # looked up and missing) are not the kernel's bugs.
            argv = [str(sanitizer), "--tool", tool, "--log-file", str(log), "--print-limit", "100",
                    "--report-api-errors", "no",
                    "--kernel-name", f"kne={entry}", sys.executable, "-m", "pnex_magic._sanitize_child", str(folder)]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_child_env())
            except subprocess.TimeoutExpired:
                raise PnexError(f"compute-sanitizer --tool {tool} on {spec.name}() ran past {timeout:.0f} s") from None
            logs[tool] = log.read_text(errors="replace") if log.exists() else done.stdout
            outputs[tool] = (done.stdout + done.stderr).strip()
            codes[tool] = done.returncode
            found = parse_output(logs[tool], tool)
            if fn is not None:
                code = fn.__code__
                last = max((ln for _, _, ln in code.co_lines() if ln is not None), default=code.co_firstlineno)
                found = [map_to_source(f, code.co_filename, code.co_firstlineno, last) for f in found]
            findings += found
    return SanitizerReport(spec.name, str(sanitizer), tools, tuple(findings), logs, outputs, codes)
