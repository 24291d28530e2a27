"""The parts of ``benchmarks/first_use_phases.py``, which is the command line (and, with
``--child``, each fresh process it measures).

* :mod:`.phases`: the phases and the functions that open them;
* :mod:`.instruments`: the child's clock, import hooks and garbage-collection counts;
* :mod:`.child`: one fresh process's figures;
* :mod:`.rounds`: the fresh processes, interleaved round by round;
* :mod:`.summary`: the rows (minimum and median per phase) and the printed tables.

The package imports nothing itself, and its modules import only the standard library at module
level: a child's clock starts before torch, pnex or Numba is imported.
"""
