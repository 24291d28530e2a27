"""Highlighted listings of PTX, SASS and Python source.

Pygments has no lexer for PTX or SASS; :class:`PtxLexer` and :class:`SassLexer`
fill that gap.  :func:`highlight` turns tokens into HTML with inline colours
taken from the Jupyter theme (so highlighting follows a light or dark theme);
:func:`listing` adds a scrollable, length-capped block around it.
"""

from __future__ import annotations

import html as _html
import re
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

from .html import code, note, pre, readable

__all__ = ["PtxLexer", "SassLexer", "highlight", "listing", "python_lexer", "MAX_LISTING_LINES"]

#: PTX and SASS beyond this many lines are cut in the HTML (the report object keeps all).
MAX_LISTING_LINES = 5000

# Token colours: JupyterLab's editor theme variables, so highlighting follows the
# light/dark theme (the fallbacks are mid-tones), made readable() on either.
_TOKEN_COLOURS = [(ttype, readable(colour)) for ttype, colour in [
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
]]


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
    taken from the Jupyter theme (see :data:`_TOKEN_COLOURS`).  No ``<style>`` block, so it survives sanitisers
    and needs no CSS of its own."""
    parts: list[str] = []
    current: str | None = None
    buffer: list[str] = []

    def flush() -> None:
        if buffer:
            body = _html.escape("".join(buffer), quote=False)
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


def python_lexer():
    from pygments.lexers import PythonLexer

    return PythonLexer()


def listing(text: str, lexer: Any, what: str) -> str:
    """A highlighted, scrollable listing, cut at :data:`MAX_LISTING_LINES` lines."""
    lines = text.splitlines(keepends=True)
    cut = ""
    if len(lines) > MAX_LISTING_LINES:
        cut = note(f"showing the first {MAX_LISTING_LINES} of {len(lines)} lines; the report object has all "
                     f"({code(what)})")
        text = "".join(lines[:MAX_LISTING_LINES])
    return pre(highlight(text, lexer), max_height="32em") + cut
