"""Rendering: how reports look.  :mod:`.report` turns a report into HTML (tabs made
of CSS alone), text and, on request, an ipywidgets view; :mod:`.listings` highlights PTX, SASS and Python;
:mod:`.summary` the compact text summary an untrusted notebook shows instead of the tabs;
:mod:`.html` holds the shared HTML fragments and theme colours; :mod:`.progress`
the progress bar and folded logs of a running ``%%pnex`` cell.  Nothing here
computes anything: it reads the core's result objects."""
