"""Sphinx configuration of the pnex_magic documentation.

Build (what tests/test_docs.py does in CI, into a temporary folder)::

    pip install -e ".[docs]"
    python -m sphinx -W -b html docs docs/_build/html

Pages are MyST markdown; the notebooks (``docs/notebooks`` is a link to
``notebooks/``) are rendered by myst-nb from their saved outputs, never executed
here; the API reference comes from the docstrings (autodoc + napoleon); the
tables of measured results are generated from ``benchmarks/results/*.json`` by
``_ext/pnex_results.py`` at build time.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(REPO))  # this checkout's pnex_magic, not an installed copy

project = "pnex_magic"
author = "the pnex_magic developers"
copyright = "pnex_magic developers"
from pnex_magic import __version__ as release  # noqa: E402

version = release

extensions = [
    "myst_nb",  # MyST markdown pages and .ipynb notebooks (brings myst_parser)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "pnex_results",  # tables from benchmarks/results/*.json
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]

# --- MyST / myst-nb ---
myst_enable_extensions = ["colon_fence", "deflist", "attrs_block", "attrs_inline"]
myst_heading_anchors = 3
# The notebooks carry the outputs of a GPU run (H200); the docs show those, never re-run them.
nb_execution_mode = "off"
# A %%pnex report is text/html with a <style> block and radio inputs (CSS-only tabs); myst-nb
# passes HTML outputs through as raw HTML, so the tabs work without JavaScript, as in nbconvert.
nb_output_stderr = "show"
nb_merge_streams = True

# --- autodoc / napoleon (the docstrings are numpydoc) ---
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False}
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

# --- HTML ---
html_theme = "furo"
html_title = f"pnex_magic {release}"
html_static_path = ["_static"]
html_css_files = ["pnex-docs.css"]
html_theme_options = {"navigation_with_keys": True}
html_show_sourcelink = False
suppress_warnings: list[str] = []
# Quotes stay as written: names such as XLA's and code such as 'reduce-overhead' are quoted text.
smartquotes = False
