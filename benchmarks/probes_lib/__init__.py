"""The parts of ``benchmarks/probes.py``, which is the command line (``python benchmarks/probes.py
[probe ...]``) and the facade that exports every probe.

* :mod:`.common`: ``HERE``, ``OUT`` and CUDA-event timing;
* :mod:`.bandwidth`: the ``copy`` and ``inflight`` probes;
* :mod:`.jax_routes`: the ``jax``, ``muladd-ncu`` and ``muladd-chain`` probes;
* :mod:`.host`: the ``first-use``, ``per-call`` and ``tools`` probes.

The package imports nothing itself; every probe imports torch, JAX or pnex when it runs.
"""
