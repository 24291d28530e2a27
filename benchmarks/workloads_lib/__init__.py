"""The parts of ``benchmarks/workloads.py``, which is the command line and the facade that
notebooks, tests and other benchmarks import (``import workloads as wl``).

Shared by every workload (none of them imports a workload module):

* :mod:`.timing`: timing a call (CUDA events or wall clock), host time, the memory floor;
* :mod:`.results`: :class:`~.results.Row`, :class:`~.results.Workload`, tables, goal lines;
* :mod:`.rounds`: running the variants in interleaved rounds, and the ``--rounds`` setting;
* :mod:`.provenance`: the environment of a run, ``same_kernel``, the ops' module name.

The workloads (each imports the shared modules above):

* :mod:`.diffusion_kernels` and :mod:`.diffusion_bench`: the 2-D diffusion stencil;
* :mod:`.lltm`: the LLTM cell's fused forward and backward kernels;
* :mod:`.kmeans`: the k-means assignment step.

The package imports nothing itself, so that ``import workloads_lib.results`` stays light.
"""
