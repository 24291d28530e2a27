"""The report's tuning sections: the autotune candidates (Launch tab) and the
bandwidth bars against the device's limits (Timing tab), as HTML fragments."""

from __future__ import annotations

import math

from ..efficiency import Efficiency
from ..launch.autotune import format_block
from ..report import KernelReport
from ..timing import format_bytes, format_time
from .html import ACCENT, BORDER, FG_MUTED, OK, WARN, code, escape, note, table

__all__ = ["autotune_html", "efficiency_html"]


def autotune_html(k: KernelReport) -> str:
    """The autotune candidates, with their times and the choice for --args."""
    tuned = k.autotune
    head = f"<div style=\"margin-top:6px\"><b>autotune</b>: {len(k.candidates)} candidate block shapes"
    if tuned is None:
        shapes = ", ".join(code(format_block(c)) for c in k.candidates)
        return head + "</div>" + note(f"{shapes}; give --args EXPR to tune on a GPU and see the choice")
    rows = []
    for i, c in enumerate(tuned.candidates):
        chosen = i == tuned.choice
        seconds = tuned.candidates[0].seconds
        relative = "" if c.seconds is None or not seconds else f"{seconds / c.seconds:.2f}×"
        status = "chosen" if chosen else (escape(c.skipped) if c.skipped else "")
        style = f"color:{OK};font-weight:600" if chosen else ""
        rows.append((
            f'<span style="{style}">{"▶ " if chosen else ""}{escape(format_block(c.block))}</span>',
            str(math.prod(c.block)),
            format_time(c.seconds) if c.seconds is not None else "–",
            relative,
            f'<span style="{style}">{status}</span>',
        ))
    summary = (f"chose {code(format_block(tuned.block))} ({escape(tuned.source)}"
               + (f"; {tuned.speedup:.2f}× the first candidate's speed" if tuned.speedup is not None else "")
               + f") for {escape(tuned.key_text)}")
    return (head + f": {summary}</div>"
            + table(rows, ("block", "threads", "device time per call", "speed vs first", ""))
            + note("The first candidate is the default (CPU simulator, CUDA-graph capture, torch.compile'd code, "
                   "PNEX_AUTOTUNE=0). "
                   "Choices are stored per GPU model and key; %%pnex --force times them again."))


def _bar(fraction: float, colour: str) -> str:
    width = max(0.0, min(1.0, fraction)) * 100
    return (
        f'<span style="display:inline-block;width:14em;height:0.8em;border:1px solid {BORDER};'
        f'vertical-align:middle;margin-right:6px"><span style="display:block;height:100%;'
        f'width:{width:.1f}%;background:{colour}"></span></span>'
    )


def efficiency_html(e: Efficiency, op_name: str, eager_name: str) -> str:
    """Bars of the op's and the eager reference's bandwidth beside the device's
    ceilings (the measured copy and the DRAM peak), and why the op is far from them."""
    rows = [(code(op_name), e.op_bandwidth, ACCENT), (code(eager_name), e.eager_bandwidth, FG_MUTED),
            ("device-to-device copy", e.copy_bandwidth, OK), ("DRAM peak", e.peak_bandwidth, BORDER)]
    rows = [r for r in rows if r[1]]
    scale = max(bw for _, bw, _ in rows) if rows else 1.0
    body = []
    for label, bw, colour in rows:
        detail = e.describe(bw) if label in (code(op_name), code(eager_name)) else f"{bw / 1e12:.3g} TB/s"
        body.append((label, _bar(bw / scale, colour) + escape(detail)))
    parts = [f"<div style=\"margin-top:6px\"><b>bandwidth against the device's limits</b> ({escape(e.device)})</div>",
             table(body)]
    if e.in_l2:
        parts.append(note(escape(f"{format_bytes(e.bytes_moved)} per call fits in L2 ({format_bytes(e.l2_bytes)}): "
                                 f"back-to-back calls hit the cache and may pass the DRAM ceilings")))
    if e.reason:
        parts.append(f'<div style="color:{WARN}">why far from the ceiling: {escape(e.reason)}</div>')
        if len(e.reasons) > 1:
            parts.append(note("also: " + escape("; ".join(e.reasons[1:]))))
    parts.append(note(escape(f"peak: {e.peak_source}; the copy is measured once per process (read + written bytes "
                             f"per second)")))
    return "".join(parts)
