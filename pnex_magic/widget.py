"""The ``%%pnex`` report: one object, three renderings.

:class:`PnexReport` gathers what one ``%%pnex`` cell built (the
:class:`~pnex_magic.report.KernelReport`, the op's spec, the binding, the SASS
and the :class:`~pnex_magic.timing.TimingResult`).  It renders as

* an ipywidgets ``Tab`` (:meth:`PnexReport.widget`) with the tabs Signature,
  Launch, PTX, Resources and Timing, built from core widgets only (``HTML``,
  ``Tab``, ``VBox``), so it needs no front-end extension beyond ipywidgets;
* static HTML (:meth:`PnexReport.to_html`): the same sections under ``<details>``,
  for nbconvert and reopened notebooks;
* plain text (:meth:`PnexReport.to_text`): for terminal IPython and logs.

Displayed, it offers all three (``_repr_mimebundle_``); each front end picks the
richest it can show.  Colours come from JupyterLab's theme variables (with
fallbacks that read on light and dark backgrounds), never fixed backgrounds.

PTX and SASS are highlighted with pygments through two small lexers defined here
(pygments has none for either); SASS comes from ``cuobjdump``/``nvdisasm`` when
the CUDA toolkit or its pip wheels provide one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import html
import os
import re
import shutil
import subprocess
import tempfile
from typing import Any

from pygments.lexer import RegexLexer, bygroups
from pygments.token import (
    Comment,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    String,
    Text,
    Token,
    Whitespace,
)

from .report import KernelReport, occupancy
from .timing import TimingResult, format_bytes, format_time

__all__ = [
    "PnexReport",
    "Disassembly",
    "PtxLexer",
    "SassLexer",
    "highlight",
    "disassemble",
    "find_disassembler",
    "tidy_sass",
    "Progress",
    "log_details_html",
    "TAB_TITLES",
]

TAB_TITLES = ("Signature", "Launch", "PTX", "Resources", "Timing")

#: PTX and SASS beyond this many lines are cut in the HTML (the report object keeps all).
MAX_LISTING_LINES = 5000

# --------------------------------------------------------------------------- theme

_FG_MUTED = "var(--jp-content-font-color2, #888)"
_BORDER = "var(--jp-border-color2, rgba(127, 127, 127, 0.35))"
_CODE_BG = "var(--jp-cell-editor-background, rgba(127, 127, 127, 0.08))"
_MONO = "var(--jp-code-font-family, SFMono-Regular, Menlo, Consolas, 'Liberation Mono', monospace)"
_ERR = "var(--jp-error-color1, #d9473f)"
_WARN = "var(--jp-warn-color1, #d98c00)"
_OK = "var(--jp-success-color1, #2e9d4f)"
_ACCENT = "var(--jp-brand-color1, #3b82c4)"

# Token colours: JupyterLab's editor theme variables, so highlighting follows the
# light/dark theme; the fallbacks are mid-tones that read on either background.
_TOKEN_COLOURS = [
    (Comment, "var(--jp-mirror-editor-comment-color, #8a8a8a)"),
    (String, "var(--jp-mirror-editor-string-color, #c2571a)"),
    (Number, "var(--jp-mirror-editor-number-color, #2a9d6f)"),
    (Keyword.Type, "var(--jp-mirror-editor-builtin-color, #3b82c4)"),
    (Keyword, "var(--jp-mirror-editor-keyword-color, #a45bd6)"),
    (Name.Label, "var(--jp-mirror-editor-def-color, #d14d72)"),
    (Name.Function, "var(--jp-mirror-editor-def-color, #d14d72)"),
    (Name.Decorator, "var(--jp-mirror-editor-meta-color, #b07d18)"),
    (Name.Variable, "var(--jp-mirror-editor-variable-2-color, #1f7fbf)"),
    (Name.Builtin, "var(--jp-mirror-editor-builtin-color, #3b82c4)"),
    (Name.Class, "var(--jp-mirror-editor-def-color, #d14d72)"),
    (Operator.Word, "var(--jp-mirror-editor-keyword-color, #a45bd6)"),
]


def _colour(ttype) -> str | None:
    for parent, colour in _TOKEN_COLOURS:
        if ttype in parent:
            return colour
    return None


# --------------------------------------------------------------------------- lexers


class PtxLexer(RegexLexer):
    """NVIDIA PTX: directives, instructions with their modifiers, registers,
    predicates, labels, numbers (including ``0f3F800000`` float literals), comments."""

    name = "PTX"
    aliases = ["ptx"]
    filenames = ["*.ptx"]

    tokens = {
        "root": [
            (r"\n", Whitespace),
            # An instruction at the start of a line, with an optional @%p guard.
            (
                r"^([ \t]*)(@!?%[\w]+)?([ \t]*)([a-z][\w]*(?:\.[\w]+)*)(?=[ \t;])",
                bygroups(Whitespace, Name.Decorator, Whitespace, Keyword),
            ),
            (r"[ \t]+", Whitespace),
            (r"//.*?$", Comment.Single),
            (r"/\*", Comment.Multiline, "comment"),
            (r'"(\\\\|\\"|[^"])*"', String),
            (r"\.[A-Za-z_]\w*", Keyword.Type),
            (r"%[A-Za-z_]\w*<\d+>", Name.Variable),  # a register range: .reg .b32 %r<5>;
            (r"%[A-Za-z_]\w*(?:\.[xyzw])?", Name.Variable),
            (r"[$A-Za-z_][\w$]*(?=:)", Name.Label),
            (r"0[fF][0-9a-fA-F]{8}\b|0[dD][0-9a-fA-F]{16}\b", Number.Float),
            (r"0[xX][0-9a-fA-F]+U?", Number.Hex),
            (r"\d+\.\d*(?:[eE][-+]?\d+)?", Number.Float),
            (r"\d+U?", Number.Integer),
            (r"[$A-Za-z_][\w$]*", Name),
            (r"[{}()\[\];,:<>+\-*/=!|&~^]", Punctuation),
            (r".", Text),
        ],
        "comment": [
            (r"[^*]+", Comment.Multiline),
            (r"\*/", Comment.Multiline, "#pop"),
            (r"\*", Comment.Multiline),
        ],
    }
    flags = re.MULTILINE  # ^ matches at every line start


class SassLexer(RegexLexer):
    """SASS as ``cuobjdump -sass`` / ``nvdisasm`` print it: opcodes, registers
    (``R3``, ``UR4``, ``P0``, ``RZ``), constant-bank operands, offsets and encodings
    in comments."""

    name = "SASS"
    aliases = ["sass"]
    filenames = []

    tokens = {
        "root": [
            (r"\n", Whitespace),
            (
                r"^([ \t]*)(/\*[0-9a-fA-F]+\*/)?([ \t]*)(@!?U?P[T0-9]+[ \t]+)?"
                r"([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)(?=[ \t;])",
                bygroups(Whitespace, Comment, Whitespace, Name.Decorator, Keyword),
            ),
            (r"[ \t]+", Whitespace),
            (r"/\*.*?\*/", Comment.Multiline),
            (r"//.*?$", Comment.Single),
            (r"\.[A-Za-z_]\w*", Keyword.Type),
            (r"\b(?:U?R[0-9]+|U?RZ|U?P[0-9]|U?PT|SR_[A-Z0-9_.]+)\b", Name.Variable),
            (r"\bc\[0x[0-9a-fA-F]+\]", Name.Builtin),
            (r"[$A-Za-z_.][\w$.]*(?=:)", Name.Label),
            (r"-?0[xX][0-9a-fA-F]+", Number.Hex),
            (r"-?\d+\.\d*(?:[eE][-+]?\d+)?", Number.Float),
            (r"-?\d+", Number.Integer),
            (r"[A-Za-z_][\w$]*", Name),
            (r"[{}()\[\];,:<>+\-*/=!|&~^`]", Punctuation),
            (r".", Text),
        ],
    }
    flags = re.MULTILINE


def highlight(text: str, lexer: Any) -> str:
    """HTML for ``text`` lexed by ``lexer``: escaped, with inline ``color`` styles
    taken from the Jupyter theme.  No ``<style>`` block, so it survives sanitisers
    and needs no CSS of its own."""
    parts: list[str] = []
    current: str | None = None
    buffer: list[str] = []

    def flush() -> None:
        if buffer:
            body = html.escape("".join(buffer), quote=False)
            parts.append(f'<span style="color:{current}">{body}</span>' if current else body)
            buffer.clear()

    for ttype, value in lexer.get_tokens(text):
        colour = _colour(ttype) if ttype is not Token.Text.Whitespace else current
        if colour != current:
            flush()
            current = colour
        buffer.append(value)
    flush()
    return "".join(parts)


def _python_lexer():
    from pygments.lexers import PythonLexer

    return PythonLexer()


# --------------------------------------------------------------------------- SASS


@dataclasses.dataclass(frozen=True)
class Disassembly:
    """SASS of a cubin, or why there is none."""

    text: str | None
    tool: str | None
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.text)


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


def disassemble(cubin: bytes | None, *, timeout: float = 60.0) -> Disassembly:
    """SASS of ``cubin`` via ``cuobjdump -sass`` (or ``nvdisasm -c``)."""
    if cubin is None:
        return Disassembly(None, None, "no cubin: nvJitLink was not available to assemble the PTX")
    return _disassemble_cached(hashlib.sha256(cubin).hexdigest(), cubin, timeout)


@functools.lru_cache(maxsize=32)
def _disassemble_cached(digest: str, cubin: bytes, timeout: float) -> Disassembly:
    found = find_disassembler()
    if found is None:
        return Disassembly(None, None, f"neither cuobjdump nor nvdisasm was found: {SASS_ADVICE}")
    tool, path = found
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


# --------------------------------------------------------------------------- HTML helpers


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _code(text: str) -> str:
    return f'<code style="font-family:{_MONO}">{_e(text)}</code>'


def _listing(text: str, lexer: Any, what: str) -> str:
    """A highlighted, scrollable listing, cut at :data:`MAX_LISTING_LINES` lines."""
    lines = text.splitlines(keepends=True)
    note = ""
    if len(lines) > MAX_LISTING_LINES:
        note = _note(f"showing the first {MAX_LISTING_LINES} of {len(lines)} lines; the report object has all "
                     f"({_code(what)})")
        text = "".join(lines[:MAX_LISTING_LINES])
    return _pre(highlight(text, lexer), max_height="32em") + note


def _pre(body_html: str, *, max_height: str | None = None) -> str:
    scroll = f"max-height:{max_height};overflow:auto;" if max_height else "overflow-x:auto;"
    return (
        f'<pre style="font-family:{_MONO};font-size:12px;line-height:1.35;margin:4px 0;padding:6px 8px;'
        f'background:{_CODE_BG};border:1px solid {_BORDER};border-radius:3px;{scroll}'
        f'white-space:pre;color:inherit">{body_html}</pre>'
    )


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...] | None = None) -> str:
    cell = f"padding:2px 10px 2px 0;text-align:left;vertical-align:top;border-bottom:1px solid {_BORDER}"
    out = ['<table style="border-collapse:collapse;margin:4px 0;color:inherit">']
    if header:
        out.append("<tr>" + "".join(f'<th style="{cell};font-weight:600">{h}</th>' for h in header) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f'<td style="{cell}">{c}</td>' for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _badge(text: str, colour: str) -> str:
    return (
        f'<span style="border:1px solid {colour};color:{colour};border-radius:3px;padding:0 4px;'
        f'font-size:11px;font-weight:600">{_e(text)}</span>'
    )


def _note(text_html: str) -> str:
    return f'<div style="color:{_FG_MUTED};margin:4px 0">{text_html}</div>'


def log_details_html(title: str, log: str, *, open_: bool = False) -> str:
    """A folded ``<details>`` block holding a compiler log."""
    lines = log.rstrip().count("\n") + 1 if log.strip() else 0
    return (
        f'<details{" open" if open_ else ""} style="margin:4px 0"><summary style="cursor:pointer">{_e(title)} '
        f'({lines} line{"s" if lines != 1 else ""})</summary>{_pre(_e(log.rstrip()), max_height="24em")}</details>'
    )


# --------------------------------------------------------------------------- the report


@dataclasses.dataclass
class PnexReport:
    """What one ``%%pnex`` cell built, for display and for code (``-o VAR``).

    Attributes
    ----------
    kernel : KernelReport
        Schema, signature, launch configuration, PTX and resources (also reachable
        directly: ``report.registers`` is ``report.kernel.registers``).
    op : PnexOp
        The operator the cell defined.
    bound_name : str
        The name the op was bound to in the notebook.
    previous : str
        What that name held before ("" if it was free).
    also_bound : tuple of str
        Other names the cell defined and bound (constants, device functions).
    timing : TimingResult or None
        Correctness and timings, with ``--args`` (``None`` without).
    sass : Disassembly
        SASS of the cubin, or why there is none.
    n_threads_values : tuple of int or None
        ``n_threads`` evaluated for ``--args``.
    compile_log : str
        Everything the compilers printed while the cell compiled.
    skipped : tuple of str
        Other annotated functions in the cell that were not compiled (see ``--name``).
    """

    kernel: KernelReport
    op: Any
    bound_name: str
    previous: str = ""
    also_bound: tuple[str, ...] = ()
    timing: TimingResult | None = None
    sass: Disassembly = dataclasses.field(default_factory=lambda: Disassembly(None, None, "not requested"))
    n_threads_values: tuple[int, ...] | None = None
    compile_log: str = ""
    skipped: tuple[str, ...] = ()
    backward_of: str | None = None
    eager_text: str | None = None
    args_text: str | None = None
    not_compiled: str = ""
    _widget: Any = dataclasses.field(default=None, repr=False, compare=False)

    def __getattr__(self, name: str) -> Any:
        # Convenience: report.registers, report.ptx, ... read the KernelReport.
        if name.startswith("_") or name == "kernel":
            raise AttributeError(name)
        try:
            return getattr(self.kernel, name)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") from None

    @property
    def spec(self):
        return self.op._pnex.spec

    # ------------------------------------------------------------------ text

    def binding_text(self) -> str:
        what = f"{self.bound_name} = {self.kernel.op_name}"
        if not self.previous:
            return f"bound {what} (a new name)"
        return f"bound {what} (replacing {self.previous})"

    def lines(self) -> list[str]:
        k = self.kernel
        out = list(k.lines())
        out.insert(1, f"  bound     : {self.binding_text().removeprefix('bound ')}")
        if self.also_bound:
            out.insert(2, f"  also bound: {', '.join(self.also_bound)}")
        if self.backward_of:
            out.insert(2, f"  backward  : attached as the backward of {self.backward_of}")
        if self.not_compiled:
            out.append(f"  compiled  : no ({self.not_compiled})")
        if self.n_threads_values is not None:
            out.append(f"  n_threads : {self.n_threads_values} for --args {self.args_text or ''}".rstrip())
        sass = f"{len(self.sass.text.splitlines())} lines ({self.sass.tool})" if self.sass else self.sass.reason
        out.append(f"  sass      : {sass}")
        if self.skipped:
            out.append(f"  skipped   : {', '.join(self.skipped)} (annotated too; compile one with --name)")
        if self.timing is not None:
            out += ["  " + line for line in self.timing.lines()]
        else:
            out.append("  timing    : give --args (and --eager) to check correctness and time the op")
        return out

    def to_text(self) -> str:
        return "\n".join(self.lines())

    __str__ = to_text

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("PnexReport(...)" if cycle else self.to_text())

    # ------------------------------------------------------------------ HTML sections

    def header_html(self) -> str:
        k = self.kernel
        how = "cache hit" if k.cache_hit else f"compiled in {k.compile_seconds:.2f} s"
        if self.not_compiled:
            how = "not compiled"
        badges = []
        if k.spills:
            badges.append(_badge("SPILLS", _ERR))
        if self.timing is not None and self.timing.correctness is not None:
            c = self.timing.correctness
            badges.append(_badge("matches eager" if c.ok else "DIFFERS from eager", _OK if c.ok else _ERR))
        if self.timing is not None and self.timing.speedup is not None:
            badges.append(_badge(f"{self.timing.speedup:.2f}x vs eager", _OK if self.timing.speedup >= 1 else _WARN))
        prev = f" (replacing {_e(self.previous)})" if self.previous else " (a new name)"
        lines = [
            f'<div style="margin:2px 0"><b>{_code(self.bound_name)}</b> = {_code(k.op_name)}{prev} '
            f'&middot; {_e(k.arch)} &middot; {_e(how)} {" ".join(badges)}</div>'
        ]
        extra = []
        if self.also_bound:
            extra.append("also bound: " + ", ".join(_code(n) for n in self.also_bound))
        if self.backward_of:
            extra.append(f"attached as the backward of {_code(self.backward_of)}")
        if self.skipped:
            extra.append("not compiled: " + ", ".join(_code(n) for n in self.skipped) + " (pick with --name)")
        if extra:
            lines.append(_note(" &middot; ".join(extra)))
        return "".join(lines)

    def signature_html(self) -> str:
        k = self.kernel
        spec = self.spec
        outs = spec.outputs
        if not outs:
            mutated = ", ".join(spec.mutated)
            returns = "nothing (None)" + (f"; it writes {_code(mutated)} in place" if mutated else "")
        elif len(outs) == 1:
            returns = f"one tensor, {_code(outs[0].name)}: {_code(outs[0].describe())}"
        else:
            returns = f"a tuple of {len(outs)} tensors: " + ", ".join(_code(o.name) for o in outs)
        rows = []
        for p in spec.params:
            role = {"in": "argument", "inmut": "argument, written in place", "out": "returned",
                    "scalar": "argument", "unused": "dropped (passed None)"}[p.role]
            rows.append((_code(p.name), _code(p.describe()), _e(role)))
        args = ", ".join(p.name for p in spec.arguments)
        torch_call = "torch.ops." + k.op_name.replace("::", ".") + f"({args})"
        parts = [
            "<div><b>Python signature</b></div>",
            _pre(highlight(k.signature, _python_lexer())),
            f"<div>returns {returns}</div>",
            '<div style="margin-top:6px"><b>torch schema</b></div>',
            _pre(_e(k.schema)),
            _note(f"call it as {_code(f'{self.bound_name}({args})')} or "
                  f"{_code(torch_call)}; it works under "
                  f"torch.compile(fullgraph=True)"),
            _table(rows, ("parameter", "annotation", "role")),
        ]
        if k.source:
            parts.append(
                f'<details><summary style="cursor:pointer">kernel source</summary>'
                f"{_pre(highlight(k.source, _python_lexer()), max_height='24em')}</details>"
            )
        return "".join(parts)

    def launch_html(self) -> str:
        k = self.kernel
        axes = "XYZ"
        rows = []
        for i, expr in enumerate(k.n_threads):
            value = "" if self.n_threads_values is None else str(self.n_threads_values[i])
            tpb = k.threads_per_block[i]
            blocks = "" if k.grid is None else str(k.grid[i])
            rows.append((axes[i], _code(expr), _e(value), str(tpb), _e(blocks)))
        header = ("axis", "n_threads", "value for --args", "threads per block", "blocks")
        parts = [_table(rows, header)]
        block_total = 1
        for t in k.threads_per_block:
            block_total *= t
        parts.append(f"<div>{block_total} threads per block ({' × '.join(map(str, k.threads_per_block))})</div>")
        if k.grid is not None and k.block is not None:
            blocks = k.grid[0] * k.grid[1] * k.grid[2]
            launched = blocks * block_total
            needed = 1
            for v in self.n_threads_values or ():
                needed *= v
            idle = launched - needed if self.n_threads_values else 0
            parts.append(
                f"<div>grid {_code(str(k.grid))} blocks × block {_code(str(k.block))} threads = "
                f"{launched:,} threads launched for {_e(self.args_text or 'the example arguments')}"
                + (f" ({idle:,} beyond n_threads, kept idle by the kernel's bounds check)" if idle > 0 else "")
                + "</div>"
            )
        else:
            parts.append(_note("give --args EXPR to see the grid for concrete arguments"))
        parts.append(_note("Axes are in CUDA's X, Y, Z order: cuda.grid(2) returns (x, y); blocks per "
                           "axis = ceil(n_threads / threads per block)."))
        return "".join(parts)

    def ptx_html(self) -> str:
        k = self.kernel
        if not k.ptx:
            return _note(_e(f"no PTX: {self.not_compiled or 'the kernel was not compiled'}"))
        ptx_lines = k.ptx.count("\n") + 1
        entry = k.entry[:60] + ("…" if len(k.entry) > 60 else "")
        ptx = (
            f"<div><b>PTX</b> ({ptx_lines} lines, {_e(k.arch)}; entry {_code(entry)})</div>"
            + _listing(k.ptx, PtxLexer(), "rep.kernel.ptx")
        )
        if self.sass:
            sass = (
                f"<div><b>SASS</b> ({self.sass.text.count(chr(10)) + 1} lines, from {_e(self.sass.tool)})</div>"
                + _listing(self.sass.text, SassLexer(), "rep.sass.text")
            )
        else:
            sass = "<div><b>SASS</b></div>" + _note(_e(f"not shown: {self.sass.reason}"))
        return (
            '<div style="display:flex;flex-wrap:wrap;gap:12px">'
            f'<div style="flex:1 1 28em;min-width:0">{ptx}</div>'
            f'<div style="flex:1 1 28em;min-width:0">{sass}</div></div>'
        )

    def resources_html(self) -> str:
        k = self.kernel
        if k.registers is None:
            parts = [_note(_e("no resource figures: " + (self.not_compiled or
                     "nvJitLink was not available to assemble the PTX (pip install numba-cuda[cu12] or [cu13])")))]
            return "".join(parts)
        spill_style = f"color:{_ERR};font-weight:600" if k.spills else ""
        spills = (
            f'<span style="{spill_style}">{k.spill_store_bytes} B stored, {k.spill_load_bytes} B loaded</span>'
            if k.spills else "none"
        )
        cap = f" (capped at {k.max_registers} by --max-registers)" if k.max_registers else ""
        tpb = 1
        for t in k.threads_per_block:
            tpb *= t
        rows = [
            ("registers per thread", f"{k.registers}{_e(cap)}"),
            ("shared memory per block (static)", f"{k.shared_bytes} B"),
            ("local memory per thread", f'<span style="{spill_style}">{k.local_bytes} B</span>'),
            ("register spills", spills),
            ("constant memory (parameters)", f"{k.const_bytes} B"),
        ]
        if k.occupancy is not None:
            bar = (
                f'<span style="display:inline-block;width:8em;height:0.7em;border:1px solid {_BORDER};'
                f'vertical-align:middle;margin-right:6px"><span style="display:block;height:100%;'
                f'width:{k.occupancy * 100:.0f}%;background:{_ACCENT}"></span></span>'
            )
            rows.append((f"theoretical occupancy ({tpb} threads/block, {_e(k.arch)})", f"{bar}{k.occupancy:.0%}"))
        parts = [_table(rows)]
        if k.spills:
            parts.append(
                f'<div style="color:{_ERR}">The kernel spills registers to local memory, which is slow: '
                f"raise --max-registers, or use fewer live values per thread.</div>"
            )
        sizes = [s for s in (32, 64, 128, 256, 512, 1024)]
        occ = [(s, occupancy(k.arch, k.registers, k.shared_bytes or 0, s)) for s in sizes]
        if all(o is not None for _, o in occ):
            parts.append(_note("theoretical occupancy by threads per block:"))
            parts.append(_table([tuple(f"{s}" for s, _ in occ), tuple(f"{o:.0%}" for _, o in occ)]))
        if k.link_log.strip():
            parts.append(log_details_html("ptxas / nvJitLink log", k.link_log))
        if self.compile_log.strip():
            parts.append(log_details_html("compiler output", self.compile_log))
        return "".join(parts)

    def timing_html(self) -> str:
        t = self.timing
        if t is None:
            return _note("Give --args EXPR (example arguments) and --eager EXPR (a PyTorch function taking the "
                         "same arguments) to check the op against eager PyTorch and, on a GPU, time both.")
        parts = [f"<div>on {_e(t.device)}</div>"]
        if t.op is not None:
            rows = []
            for label, m, bw in ((t.name, t.op, t.bandwidth), (t.eager_name, t.eager, t.eager_bandwidth)):
                if m is None:
                    continue
                rows.append((
                    _code(label), format_time(m.median), f"{format_time(m.q1)} – {format_time(m.q3)}",
                    format_time(m.best), f"{m.repeat} × {m.loops}",
                    "" if bw is None else f"{bw / 1e9:.1f} GB/s",
                ))
            parts.append(_table(rows, ("", "median", "IQR", "min", "runs × loops", "bandwidth")))
            if t.speedup is not None:
                colour = _OK if t.speedup >= 1 else _WARN
                parts.append(
                    f'<div>speed-up: <b style="color:{colour}">{t.speedup:.2f}×</b> (eager median / op median)</div>'
                )
            parts.append(_note(
                f"CUDA events around back-to-back calls after warm-up; bandwidth = {format_bytes(t.bytes_moved)} "
                f"of arguments and outputs per call / median time"
            ))
        else:
            parts.append(_note(_e(f"not timed: {t.reason}")))
        c = t.correctness
        if c is not None:
            colour = _OK if c.ok else _ERR
            verdict = "matches eager" if c.ok else "DIFFERS from eager" if c.compared else "not compared"
            parts.append(f'<div style="color:{colour};font-weight:600">{verdict}</div>')
            if c.compared:
                parts.append(_table([
                    ("max abs error", f"{c.max_abs_error:.3g}"),
                    ("max rel error", f"{c.max_rel_error:.3g}"),
                    ("compared", _e(", ".join(c.compared))),
                    ("tolerance", f"rtol={c.rtol:g}, atol={c.atol:g} (torch.testing defaults for the dtype)"),
                ]))
            if c.note:
                parts.append(_note(_e(c.note)))
        elif self.eager_text is None:
            parts.append(_note("give --eager EXPR to check the results against PyTorch"))
        return "".join(parts)

    def sections(self) -> list[tuple[str, str]]:
        contents = (
            self.signature_html(), self.launch_html(), self.ptx_html(), self.resources_html(), self.timing_html(),
        )
        return list(zip(TAB_TITLES, contents, strict=True))

    # ------------------------------------------------------------------ renderings

    def to_html(self) -> str:
        """The static HTML form: every section under ``<details>`` (PTX folded)."""
        body = []
        for title, content in self.sections():
            opened = "" if title == "PTX" else " open"
            body.append(
                f'<details{opened} style="margin:4px 0">'
                f'<summary style="cursor:pointer;font-weight:600">{title}</summary>'
                f'<div style="padding-left:12px">{content}</div></details>'
            )
        return (
            f'<div class="pnex-report" style="color:inherit;font-size:13px;line-height:1.45">'
            f'<div style="font-weight:600">pnex kernel {_code(self.kernel.name)}</div>'
            f"{self.header_html()}{''.join(body)}</div>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def widget(self):
        """A fresh ipywidgets view: a header above a ``Tab`` with the five sections."""
        import ipywidgets as w

        children = [w.HTML(value=_wrap(content), layout=w.Layout(width="100%")) for _title, content in self.sections()]
        tab = w.Tab(children=children, titles=TAB_TITLES, layout=w.Layout(width="100%"))
        header = w.HTML(value=_wrap(self.header_html()), layout=w.Layout(width="100%"))
        return w.VBox([header, tab], layout=w.Layout(width="100%"))

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle: dict[str, Any] = {"text/plain": self.to_text(), "text/html": self.to_html()}
        if _in_kernel():
            if self._widget is None:
                self._widget = self.widget()
            view = self._widget._repr_mimebundle_()
            if view and "application/vnd.jupyter.widget-view+json" in view:
                bundle["application/vnd.jupyter.widget-view+json"] = view["application/vnd.jupyter.widget-view+json"]
        return bundle


def _wrap(content: str) -> str:
    # ipywidgets' HTML widget sets line-height to the height of one input row (28px);
    # reset it for multi-line content.
    return f'<div style="color:inherit;font-size:13px;line-height:1.45">{content}</div>'


def _in_kernel() -> bool:
    """Whether we run in a Jupyter kernel (a front end that may show widgets)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


# --------------------------------------------------------------------------- progress


class Progress:
    """Progress of one ``%%pnex`` cell: a bar and the current step under the cell
    in a notebook; silent in a terminal (``enabled=False``).  :meth:`finish`
    replaces it with the report (or with nothing)."""

    def __init__(self, steps: int, *, enabled: bool):
        self.enabled = enabled
        self.handle = None
        self.box = None
        if not enabled:
            return
        import ipywidgets as w
        from IPython.display import display

        self.bar = w.IntProgress(value=0, min=0, max=max(1, steps), bar_style="info", layout=w.Layout(width="14em"))
        self.label = w.HTML(value="")
        self.box = w.HBox([self.bar, self.label])
        self.handle = display(self.box, display_id=True)

    def step(self, text: str) -> None:
        if not self.enabled:
            return
        self.bar.value = min(self.bar.max, self.bar.value + 1)
        self.label.value = f'<span style="color:{_FG_MUTED}">{_e(text)}…</span>'

    def finish(self, replacement: Any = None) -> bool:
        """Replace the progress display with ``replacement``; returns whether it did."""
        if not self.enabled or self.handle is None:
            return False
        if replacement is None:
            self.handle.update({"text/plain": ""}, raw=True)
        else:
            self.handle.update(replacement)
        if self.box is not None:
            self.box.close()
        self.enabled = False
        return replacement is not None


class LogDisplay:
    """A folded compiler log shown above a failed cell's error message."""

    def __init__(self, title: str, log: str):
        self.title = title
        self.log = log

    def _repr_mimebundle_(self, include=None, exclude=None):
        lines = self.log.rstrip().count("\n") + 1
        return {
            "text/plain": f"({self.title}: {lines} lines; see the exception's .compiler_log)",
            "text/html": log_details_html(self.title, self.log),
        }
