"""The report's Profile tab (Nsight Compute's figures of one launch:
:class:`~pnex_magic.profiling.KernelProfile`) and its compute roofline (the Timing
tab's FLOP/s against the GPU's compute peak: :class:`~pnex_magic.roofline.Compute`),
as HTML fragments.  Both take the objects as they come (nothing of the stages that
make them is imported here), so that those stages can draw them too."""

from __future__ import annotations

from typing import Any

from .html import ACCENT, BORDER, FG_MUTED, OK, WARN, code, escape, note, table, themed

__all__ = ["profile_html", "compute_html", "share_bar"]


def share_bar(fraction: float | None, colour: str = ACCENT) -> str:
    """A bar as long as ``fraction`` (0..1) of its track."""
    width = 0.0 if fraction is None else max(0.0, min(1.0, fraction)) * 100
    return (
        f'<span style="display:inline-block;width:10em;height:0.8em;border:1px solid;{themed("border-color", BORDER)};'
        f'vertical-align:middle;margin-right:6px"><span style="display:block;height:100%;width:{width:.1f}%;'
        f'{themed("background", colour)}"></span></span>'
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _why(reason: Any, title: str) -> str:
    if reason is None:
        return ""
    return (f'<div style="color:{WARN};margin-top:6px"><b>{escape(title)}</b>: {escape(reason.finding)}</div>'
            f"<div><b>what to change</b>: {escape(reason.advice)}</div>")


def profile_html(p: Any) -> str:
    """The Profile tab: speed of light, occupancy, the top stall reasons and the source
    lines with the most stall samples; or why there is no profile."""
    f = p.figures
    if f is None:
        return note(escape(f"not profiled: {p.note}"))
    took = f", {f.duration * 1e6:.1f} µs" if f.duration else ""
    parts = [f"<div>Nsight Compute {escape(p.version)}: one launch of {code(p.kernel)} on "
             f"{escape(f.device or 'the GPU')}{escape(took)}</div>"]
    rows = [("memory (speed of light)", share_bar(f.memory_sol) + _pct(f.memory_sol)),
            ("compute (SM, speed of light)", share_bar(f.compute_sol) + _pct(f.compute_sol)),
            ("DRAM", share_bar(f.dram_sol, FG_MUTED) + _pct(f.dram_sol))]
    if f.tensor_pipe:
        rows.append(("tensor pipe", share_bar(f.tensor_pipe) + _pct(f.tensor_pipe)))
    occupancy = _pct(f.achieved_occupancy) + (f" of {_pct(f.theoretical_occupancy)} theoretical"
                                              if f.theoretical_occupancy is not None else "")
    rows.append(("achieved occupancy", share_bar(f.achieved_occupancy, OK) + escape(occupancy)))
    parts.append(table(rows))
    if f.stalls:
        stall_rows = [(code(s.name), share_bar(s.share, WARN) + f"{s.share:.0%}", escape(s.meaning))
                      for s in f.stalls[:5]]
        issuing = f"; warps issued in {f.issuing:.0%} of them" if f.issuing is not None else ""
        parts.append(f'<div style="margin-top:6px"><b>where warps wait</b> (share of {escape(f.stall_source)}'
                     f"{escape(issuing)})</div>" + table(stall_rows, ("stall reason", "share", "meaning")))
    if p.hot_lines:
        line_rows = [(str(line.line), f"{line.share:.0%}", f"{line.stalled_share:.0%}", escape(line.reason or ""),
                      code(line.text)) for line in p.hot_lines]
        parts.append('<div style="margin-top:6px"><b>the lines where warps spend their time</b></div>'
                     + table(line_rows, ("line", "samples", "stalled", "top reason", "source")))
    parts.append(_why(p.reason(), "what the figures say"))
    if p.note:
        parts.append(note(escape(p.note)))
    if p.report_path:
        parts.append(note(f"the report: {code(p.report_path)} (Nsight Compute's GUI, ncu-ui, opens it)"))
    return "".join(parts)


def compute_html(c: Any) -> str:
    """The compute roofline: FLOP per call, FLOP/s and its share of the compute peak,
    the arithmetic intensity against the ridge point, the tensor cores."""
    count = f"{c.flops:,}" if c.flops is not None else "unknown"
    rows = [("FLOP per call", escape(f"{count}: {c.how}"))]
    if c.rate is None:
        rows.append(("FLOP/s", escape("not timed: needs a timed call on the GPU")))
    else:
        rows.append(("FLOP/s", share_bar(c.share) + escape(c.describe())))
        if c.peak is not None:
            rows.append(("compute peak", escape(c.peak.source)))
        if c.intensity is not None and c.ridge is not None:
            rows.append(("roofline", escape(c.roofline_text)))
    if c.tensor is not None:
        rows.append(("tensor cores", escape(f"used: {c.tensor.count} {c.tensor.instruction} ({c.tensor.precision})")))
    parts = ['<div style="margin-top:6px"><b>compute against the device\'s peak</b></div>', table(rows)]
    return "".join(parts)
