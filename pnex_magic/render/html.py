"""HTML building blocks shared by every rendered pnex object: theme colours and
small escaped fragments (code, preformatted blocks, tables, badges, notes, folded
logs).

Colours are JupyterLab's theme variables with fallbacks that read on light and
dark backgrounds; no fragment sets a fixed background, and everything is inline
style (no ``<style>`` block), so the HTML survives sanitisers (GitHub, nbviewer,
VS Code) and needs no CSS of its own.
"""

from __future__ import annotations

import html as _html
from typing import Any

__all__ = [
    "FG_MUTED", "BORDER", "CODE_BG", "MONO", "ERR", "WARN", "OK", "ACCENT",
    "escape", "code", "pre", "table", "badge", "note", "log_details_html",
]

FG_MUTED = "var(--jp-content-font-color2, #888)"
BORDER = "var(--jp-border-color2, rgba(127, 127, 127, 0.35))"
CODE_BG = "var(--jp-cell-editor-background, rgba(127, 127, 127, 0.08))"
MONO = "var(--jp-code-font-family, SFMono-Regular, Menlo, Consolas, 'Liberation Mono', monospace)"
ERR = "var(--jp-error-color1, #d9473f)"
WARN = "var(--jp-warn-color1, #d98c00)"
OK = "var(--jp-success-color1, #2e9d4f)"
ACCENT = "var(--jp-brand-color1, #3b82c4)"



def escape(value: Any) -> str:
    return _html.escape(str(value), quote=True)


def code(text: str) -> str:
    return f'<code style="font-family:{MONO}">{escape(text)}</code>'


def pre(body_html: str, *, max_height: str | None = None) -> str:
    scroll = f"max-height:{max_height};overflow:auto;" if max_height else "overflow-x:auto;"
    return (
        f'<pre style="font-family:{MONO};font-size:12px;line-height:1.35;margin:4px 0;padding:6px 8px;'
        f'background:{CODE_BG};border:1px solid {BORDER};border-radius:3px;{scroll}'
        f'white-space:pre;color:inherit">{body_html}</pre>'
    )


def table(rows: list[tuple[str, ...]], header: tuple[str, ...] | None = None) -> str:
    cell = f"padding:2px 10px 2px 0;text-align:left;vertical-align:top;border-bottom:1px solid {BORDER}"
    out = ['<table style="border-collapse:collapse;margin:4px 0;color:inherit">']
    if header:
        out.append("<tr>" + "".join(f'<th style="{cell};font-weight:600">{h}</th>' for h in header) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f'<td style="{cell}">{c}</td>' for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def badge(text: str, colour: str) -> str:
    return (
        f'<span style="border:1px solid {colour};color:{colour};border-radius:3px;padding:0 4px;'
        f'font-size:11px;font-weight:600">{escape(text)}</span>'
    )


def note(text_html: str) -> str:
    return f'<div style="color:{FG_MUTED};margin:4px 0">{text_html}</div>'


def log_details_html(title: str, log: str, *, open_: bool = False) -> str:
    """A folded ``<details>`` block holding a compiler log."""
    lines = log.rstrip().count("\n") + 1 if log.strip() else 0
    return (
        f'<details{" open" if open_ else ""} style="margin:4px 0"><summary style="cursor:pointer">{escape(title)} '
        f'({lines} line{"s" if lines != 1 else ""})</summary>{pre(escape(log.rstrip()), max_height="24em")}</details>'
    )
