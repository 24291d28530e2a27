"""The report's compact plain-text summary: what an untrusted notebook (or GitHub)
shows in place of the tabs, whose ``<style>`` its sanitiser drops
(:func:`~pnex_magic.render.html.static_view`).  A few lines: the kernel and what
it was bound to, its signature, the launch, the registers and occupancy, and the
correctness and timing verdicts (the speed-up, and the share of the ceiling with
the headline of the reason when it is far); listings and bars stay out."""

from __future__ import annotations

import math
from typing import Any

from ..efficiency import FAR, share_text
from ..timing import format_time

__all__ = ["summary_text", "TRUST_HINT"]

#: The summary's last line: where the full report shows.
TRUST_HINT = ("The full report (tabs: signature, launch, PTX, SASS, resources, timing) shows where the notebook is "
              "trusted: in JupyterLab, File > Trust Notebook.")


def summary_text(report: Any) -> str:
    """The summary of a :class:`~pnex_magic.render.report.PnexReport`."""
    k = report.kernel
    out = [f"pnex kernel {k.name!r}: {report.binding_text()}", f"  {k.signature}"]
    t = report.timing
    block = k.autotune.block if k.autotune is not None else k.threads_per_block
    threads = math.prod(block)
    if k.grid is not None:
        launch = f"grid {k.grid} × block {k.block} for {report.args_text or 'the example arguments'}"
    else:
        launch = f"n_threads ({', '.join(k.n_threads)}), {threads} threads per block"
    if k.autotune is not None and k.autotune.timed:
        launch += f"; autotuned: {k.autotune.candidates[k.autotune.choice].label()}"
    if k.dynamic_shared_bytes:
        launch += f"; {k.dynamic_shared_bytes:,} B dynamic shared memory per block"
    out.append(f"  launch    : {launch}")
    arch = f"{k.arch} (a stand-in compile target: no GPU here)" if k.stand_in else k.arch
    if k.registers is not None:
        resources = f"{arch}, {k.registers} registers per thread"
        if k.occupancy is not None:
            resources += f", occupancy {k.occupancy:.0%} ({threads} threads per block)"
        resources += f", spills: {k.spill_store_bytes} B stored, {k.spill_load_bytes} B loaded" if k.spills else ""
    else:
        resources = f"{arch}, not compiled" if report.not_compiled else f"{arch}, no resource figures"
    out.append(f"  resources : {resources}")
    if report.simulated and (t is None or t.op is not None):  # a CPU run's timing line says it itself
        out.append("  runs in   : numba-cuda's CUDA simulator, on CPU tensors")
    if t is not None and t.correctness is not None:
        out.append(f"  correct   : {t.correctness}")
    if t is None:
        out.append("  timing    : give --args (and --eager) to check correctness and time the op")
    elif t.op is None:
        out.append(f"  timing    : not timed: {t.reason}")
    else:
        timed = f"{t.name} {format_time(t.op.median)}"
        if t.eager is not None:
            timed += f", {t.eager_name} {format_time(t.eager.median)}"
        if t.speedup is not None:
            timed += f": {t.speedup:.2f}× eager's speed"
        out.append(f"  timing    : {timed} on {t.device}")
        e = k.efficiency
        if e is not None and e.op_bandwidth is not None:
            line = f"{e.rate(e.op_bandwidth)}: {e.verdict}"
            found = e.explanation
            if found is not None:
                line = (f"{e.rate(e.op_bandwidth)}: {share_text(e.op_of_ceiling)} of the ceiling, below {FAR:.0%}: "
                        f"{found.headline}")
            out.append(f"  bandwidth : {line}")
    out.append(TRUST_HINT)
    return "\n".join(out)
