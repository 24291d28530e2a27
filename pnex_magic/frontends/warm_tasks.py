"""What ``%load_ext pnex_magic`` warms up besides Numba: the magic's own first-cell costs.

:func:`pnex_magic.warmup.start` runs these in its background thread after Numba's
one-time set-up (the magic hands them in: :data:`TASKS`), so that the first
``%%pnex`` cell finds them done:

* the C++ launcher is imported when it is built already (its header search and its
  library load), else its build starts in the background (:func:`pnex_magic.launch.switch.prepare`),
  a few seconds before the first cell would start it;
* the report's syntax highlighters are made: pygments' lexers compile their regular
  expressions when first made, 50 ms of the first cell's report otherwise;
* ipywidgets is imported (the cell's progress bar): 0.14 s of the first cell on the
  GPU machine (cProfile of the cell, ``benchmarks/first_use.py``).
"""

from __future__ import annotations

from ..launch import switch
from ..render.listings import PtxLexer, SassLexer, highlight, python_lexer

__all__ = ["TASKS"]


def _warm_launcher() -> None:
    switch.prepare()


def _warm_report() -> None:
    for lexer in (python_lexer(), PtxLexer(), SassLexer()):
        highlight("x = 1\n", lexer)
    import ipywidgets  # noqa: F401


#: The tasks, in the order they run.
TASKS = (_warm_launcher, _warm_report)
