"""HTML building blocks shared by every rendered pnex object: theme colours and
small escaped fragments (code, preformatted blocks, tables, badges, notes, folded
logs).

Colours are JupyterLab's theme variables with fallbacks; every colour of text is
:func:`readable`: the theme's hue mixed 65:35 with the surrounding text colour,
which keeps it at a contrast of at least 4.5:1 on the light and the dark theme
(JupyterLab's own editor colours are not: its dark theme's comments are 3.5:1).
No fragment sets a fixed background.  Everything is inline style
except the one ``<style>`` block of :func:`tabs`, and every piece degrades on its
own where a front end cleans the HTML.  What the front ends keep (checked in
JupyterLab 4.6, Notebook 7.6 and nbconvert 7.17 by ``tests/test_browser.py``; for
GitHub and nbviewer from their maintainers' statements):

=====================  ========  =====================  ============  ==========
front end              <style>   inline style           <input>       <details>
=====================  ========  =====================  ============  ==========
JupyterLab/Notebook 7  kept      kept                   kept          kept
  (trusted: live, or
  saved by the user)
same, untrusted        dropped   kept, but declarations  kept, made    kept
  (a notebook from               using ``var()`` are    ``disabled``,
  elsewhere)                     dropped                 no ``name``
nbconvert --to html    kept      kept                   kept          kept
nbviewer               kept      kept                   kept          kept
  (nbconvert, outputs
  not sanitised)
GitHub                 dropped   (reported kept)        unknown       kept
=====================  ========  =====================  ============  ==========

So the report ships two views, as xarray's HTML repr does: a compact plain-text
summary in a ``<pre class="pnex-fallback">``, and the rich view (tabs) in a
``<div class="pnex-rich" style="display:none">``.  The one ``<style>`` block hides the
summary and shows the rich view (``display:block !important`` beats the inline
``display:none``).  Where ``<style>`` is dropped (an untrusted notebook, GitHub), the
summary shows and the rich view stays hidden; everywhere else, the tabs.  Colours
that a view needs even where ``var()`` is dropped (bar fills, badge borders) come
with a plain colour first (:func:`themed`).
"""

from __future__ import annotations

import html as _html
import re
import uuid
from collections.abc import Sequence
from typing import Any

__all__ = [
    "FG_MUTED", "BORDER", "CODE_BG", "MONO", "ERR", "WARN", "OK", "ACCENT", "readable", "themed",
    "escape", "code", "pre", "table", "badge", "note", "log_details_html", "tabs", "static_view",
]

FG_MUTED = "var(--jp-content-font-color2, #888)"
BORDER = "var(--jp-border-color2, rgba(127, 127, 127, 0.35))"
CODE_BG = "var(--jp-cell-editor-background, rgba(127, 127, 127, 0.08))"
MONO = "var(--jp-code-font-family, SFMono-Regular, Menlo, Consolas, 'Liberation Mono', monospace)"
ACCENT = "var(--jp-brand-color1, #3b82c4)"  # bars and borders, not text


def readable(colour: str) -> str:
    """``colour`` as a colour for text: mixed 65:35 with the inherited text colour, so
    that it darkens on a light theme and lightens on a dark one.  Where a front end
    drops the declaration (a sanitiser, a browser without ``color-mix``), the text
    keeps the page's own colour."""
    return f"color-mix(in srgb, {colour} 65%, currentColor)"


ERR = readable("var(--jp-error-color1, #d9473f)")
WARN = readable("var(--jp-warn-color1, #d98c00)")
OK = readable("var(--jp-success-color1, #2e9d4f)")


def themed(prop: str, colour: str) -> str:
    """``prop:colour`` preceded by ``prop:`` and the colour's plain fallback (the first
    ``#rrggbb`` in it), so that a sanitiser dropping declarations that use ``var()`` or
    ``color-mix()`` leaves the plain one."""
    plain = re.search(r"#[0-9a-fA-F]{6}\b", colour)
    return (f"{prop}:{plain.group(0)};" if plain and plain.group(0) != colour else "") + f"{prop}:{colour}"


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
    """A small framed label; it never breaks over two lines (``11.77× vs eager`` stays whole)."""
    return (
        f'<span style="border:1px solid;{themed("border-color", colour)};color:{colour};border-radius:3px;'
        f'padding:0 4px;font-size:11px;font-weight:600;white-space:nowrap;display:inline-block">{escape(text)}</span>'
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


# Tabs from CSS alone.  Each section is an open <details> block; the tab bar (radio
# buttons in labels) is hidden by an inline style that only the <style> block of
# static_view() overrides, and the sections are hidden and picked by `:has()` rules that
# need the radio buttons.  So a browser without `:has()`, or a front end that keeps
# <style> but drops <input>, shows every section under its <summary> heading instead:
# nothing is ever hidden without a way to show it.
_TAB_CSS = (
    ".pnex-tabs:has(input)>.pnex-bar{display:flex!important;flex-wrap:wrap;gap:2px;"
    f"border-bottom:1px solid {BORDER};margin:6px 0 4px}}"
    ".pnex-tabs:has(input)>.pnex-panel{display:none}"
    ".pnex-tabs:has(input)>.pnex-panel>summary{display:none}"
    ".pnex-tabs:has(input)>.pnex-panel>div{padding-left:0!important}"
    ".pnex-tab{position:relative;padding:3px 12px;cursor:pointer;border:1px solid transparent;"
    "border-bottom:none;border-radius:3px 3px 0 0;margin-bottom:-1px;user-select:none}"
    ".pnex-tab>input{position:absolute;opacity:0;width:1px;height:1px;margin:0;pointer-events:none}"
    f".pnex-tab:has(input:checked){{border-color:{BORDER};border-top:2px solid {ACCENT};font-weight:600;"
    "background:var(--jp-layout-color0, transparent)}"
    f".pnex-tab:has(input:focus-visible){{outline:2px solid {ACCENT};outline-offset:-2px}}"
)
# The summary wraps its long lines between words: JupyterLab styles an output's <pre> with
# `word-break: break-all`, which splits words anywhere ("la/rgest"); an inline style wins,
# and is kept where the sanitiser drops <style> (it holds no var()).
_FALLBACK_STYLE = "white-space:pre-wrap;word-break:normal;overflow-wrap:break-word;margin:4px 0;color:inherit"
# Where <style> applies, the rich view replaces the text summary.
_VIEW_CSS = ">.pnex-fallback{display:none}>.pnex-rich{display:block!important}"


def tabs(sections: Sequence[tuple[str, str]]) -> str:
    """Sections ``(title, html)`` as tabs made of CSS alone (the first one shown; the
    CSS is :func:`static_view`'s); where the CSS or the radio buttons are removed, the
    sections one under the other."""
    group = f"pnex-tabs-{uuid.uuid4().hex[:12]}"  # one radio group per rendering
    labels = "".join(
        f'<label class="pnex-tab"><input type="radio" name="{group}"{" checked" if i == 0 else ""}>'
        f"{escape(title)}</label>"
        for i, (title, _html) in enumerate(sections)
    )
    panels = "".join(
        f'<details open class="pnex-panel pnex-p{i}" style="margin:4px 0">'
        f'<summary style="cursor:pointer;font-weight:600">{escape(title)}</summary>'
        f'<div style="padding-left:12px">{body}</div></details>'
        for i, (title, body) in enumerate(sections)
    )
    return f'<div class="pnex-tabs"><div class="pnex-bar" style="display:none">{labels}</div>{panels}</div>'


def static_view(summary: str, rich_html: str, tab_count: int) -> str:
    """The report as one HTML fragment with two views: ``summary`` (plain text) in a
    ``<pre class="pnex-fallback">``, shown where ``<style>`` is dropped, and ``rich_html``
    (holding :func:`tabs` of ``tab_count`` sections) in a ``<div class="pnex-rich">``,
    hidden by an inline style that the one ``<style>`` block overrides."""
    picks = "".join(
        f".pnex-tabs:has(>.pnex-bar>label:nth-child({i + 1})>input:checked)>.pnex-p{i}{{display:block}}"
        for i in range(tab_count)
    )
    return (
        f'<div class="pnex-report" style="color:inherit;font-size:13px;line-height:1.45">'
        f"<style>{_scoped(_VIEW_CSS)}{_scoped(_TAB_CSS + picks, ' ')}</style>"
        f'<pre class="pnex-fallback" style="{_FALLBACK_STYLE}">{escape(summary)}</pre>'
        f'<div class="pnex-rich" style="display:none">{rich_html}</div></div>'
    )


def _scoped(css: str, joiner: str = "") -> str:
    """Prefix every rule with ``.pnex-report`` (and ``joiner``) so nothing outside a
    report is styled."""
    return "".join(f".pnex-report{joiner}{rule}}}" for rule in css.split("}") if rule.strip())
