"""The parts of ``benchmarks/jax_overhead.py``, which is the command line and the facade that
tests and other benchmarks import (``import jax_overhead``: ``diffusion_loops``, ``hlo_counts``,
``KERNELS``, ``N_LARGE`` and the rest, as before).

* :mod:`.settings`: the sizes, the sections and their goals (pure Python: read before ``--help``);
* :mod:`.measure`: logging into ``$OUT``, result checks against float64, timing, HLO counts;
* :mod:`.kernels`: the kernels, defined as a user's cell defines them, and the diffusion loops;
* :mod:`.sections`: the in-process sections (diffusion, stencil_hlo, muladd_1gib, donation, per_call);
* :mod:`.processes`: the sections run in fresh processes (first_use, command_buffers);
* :mod:`.table`: the table printed last.

The package imports nothing itself, so that ``import jax_overhead_lib.settings`` stays light.
"""
