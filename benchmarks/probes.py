"""Design probes on the GPU machine: facts that decide how a feature is built, measured
before building it (not a benchmark of the product; those are the other scripts).

    python benchmarks/probes.py [copy] [jax] [first-use] [per-call] [tools]

* ``copy``: copy kernels written with several elements per thread (one per thread,
  block-strided with the store after each load, block-strided with all loads first,
  the same with an unchecked full-block path, consecutive elements per thread)
  against ``torch.clone`` at 16 M and 256 M float32 elements: what ``pnex.Tune``'s
  example and the report's advice should teach (issue 19);
* ``jax``: the compiled HLO (copies, conditionals, custom calls in the while body)
  and per-step times of the notebook's diffusion stencil in a ``fori_loop``, with an
  ``InMut`` carry and with an ``Out`` (issue 17);
* ``first-use``: a new and an unchanged kernel, definition to first result, in fresh
  processes, with a cProfile of each (issue 20);
* ``per-call``: host cost of one call through the PnexOp, ``torch.ops.pnex.X.default``
  and a native op, for several argument counts (issue 20);
* ``muladd-ncu``: the 1 GiB ``a*b+c`` of ``jax_overhead.py`` under ``ncu``: pnex's
  kernel launched through JAX and through the PyTorch op, and XLA's fused kernel, each
  profiled after the autotuner chose (duration, DRAM throughput, grid, block,
  registers, instructions, the width of the global loads): where JAX's 3% and XLA's
  4% come from (issue 17);
* ``muladd-chain``: the same 1 GiB ``a*b+c``, ten calls: from Python (JAX and the
  PyTorch op) and as a ``fori_loop`` of ten inside one ``jax.jit`` (one dispatch):
  whether JAX's gap is per dispatch or per kernel (issue 17);
* ``inflight``: a loads-first copy's bandwidth against the bytes each SM keeps in
  flight (element size x elements per thread x resident threads), 1 GiB per call: the
  data for the report's Little's-law model (issue 30);
* ``tools``: compute-sanitizer, ncu, nvdisasm on the machine.

Prints a short table per probe; logs under ``$OUT`` when set.

The probes live in ``benchmarks/probes_lib/`` (bandwidth, jax_routes, host); this file is the
command line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# probes_lib sits beside this file: importable when this runs as a script, when it is imported
# with benchmarks/ on sys.path, and when it is run by path (runpy, ``python -I``).
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from probes_lib.bandwidth import probe_copy, probe_inflight  # noqa: E402
from probes_lib.common import OUT  # noqa: E402
from probes_lib.host import probe_first_use, probe_per_call, probe_tools  # noqa: E402
from probes_lib.jax_routes import probe_jax, probe_muladd_chain, probe_muladd_ncu  # noqa: E402


PROBES = {"tools": probe_tools, "copy": probe_copy, "jax": probe_jax, "first-use": probe_first_use,
          "per-call": probe_per_call, "muladd-ncu": probe_muladd_ncu,
          "muladd-chain": probe_muladd_chain, "inflight": probe_inflight}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probes", nargs="*", choices=list(PROBES), default=[], help="default: all")
    ns = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    report = []
    for name in ns.probes or list(PROBES):
        start = time.perf_counter()
        try:
            rows = PROBES[name]()
        except Exception as exc:  # a probe that fails says so and the others still run
            import traceback

            rows = [f"FAILED: {type(exc).__name__}: {exc}", *traceback.format_exc().splitlines()[-6:]]
        report.append(f"== {name} ({time.perf_counter() - start:.0f} s)")
        report += ["  " + r for r in rows]
        (OUT / "probes.txt").write_text("\n".join(report) + "\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
