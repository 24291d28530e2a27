"""Notebook-only displays of a running ``%%pnex`` cell: the progress bar, and the
folded compiler log shown above a failed cell's error."""

from __future__ import annotations

from typing import Any

from .html import FG_MUTED, escape, log_details_html

__all__ = ["Progress", "LogDisplay"]


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
        self.label.value = f'<span style="color:{FG_MUTED}">{escape(text)}…</span>'

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
