"""The report's tuning sections: the autotune candidates (Launch tab) and the
bandwidth bars against the device's limits, with why the op is far from them and
what to change (Timing tab), as HTML fragments."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..efficiency import FAR, Efficiency, share_text
from ..launch.autotune import CandidateResult, TuneResult, format_block
from ..report import KernelReport
from ..timing import format_time
from .html import ACCENT, BORDER, FG_MUTED, OK, WARN, code, escape, note, pre, table, themed
from .listings import highlight, python_lexer

__all__ = ["autotune_html", "efficiency_html", "ceiling_text", "tune_names", "has_tune", "shows_autotune"]


def tune_names(candidates: Sequence[CandidateResult]) -> tuple[str, ...]:
    """The names of the ``Tune`` parameters the candidates vary, in order of appearance."""
    names: list[str] = []
    for c in candidates:
        for name, _value in c.tune:
            if name not in names:
                names.append(name)
    return tuple(names)


def has_tune(tuned: TuneResult | None) -> bool:
    """Whether the tuner's candidates carry ``Tune`` values."""
    return tuned is not None and any(c.tune for c in tuned.candidates)


def shows_autotune(k: KernelReport) -> bool:
    """Whether the op picks anything at run time: several blocks, or a ``Tune``
    parameter with several choices."""
    return bool(k.candidates) or any(len(choices) > 1 for _name, choices in k.tune) or has_tune(k.autotune)


def _space(tuned: TuneResult) -> str:
    """``20 candidates: 5 block shapes × ITEMS in (1, 2, 4, 8)``."""
    blocks = list(dict.fromkeys(c.block for c in tuned.candidates))
    parts = [f"{len(blocks)} block shape{'s' if len(blocks) != 1 else ''}"]
    for name in tune_names(tuned.candidates):
        values = list(dict.fromkeys(dict(c.tune).get(name) for c in tuned.candidates if name in dict(c.tune)))
        parts.append(f"{name} in ({', '.join(map(repr, values))})")
    return f"{len(tuned.candidates)} candidates: " + " × ".join(parts)


def autotune_html(k: KernelReport) -> str:
    """The autotune candidates (block shapes, and ``Tune`` values where the op has
    them), with their times, why any was skipped, the choice for --args and the
    total tuning time."""
    tuned = k.autotune
    if tuned is None:
        blocks = k.candidates or (k.threads_per_block,)
        space = [f"{len(blocks)} candidate block shape{'s' if len(blocks) != 1 else ''}"]
        space += [f"{escape(name)} in ({escape(', '.join(map(repr, choices)))})" for name, choices in k.tune
                  if len(choices) > 1]
        shapes = ", ".join(code(format_block(c)) for c in blocks)
        return (f"<div style=\"margin-top:6px\"><b>autotune</b>: {' × '.join(space)}</div>"
                + note(f"{shapes}; give --args EXPR to tune on a GPU and see the choice"))
    names = tune_names(tuned.candidates)
    if names:
        head = f"<div style=\"margin-top:6px\"><b>autotune</b>: {escape(_space(tuned))}"
    else:
        head = f"<div style=\"margin-top:6px\"><b>autotune</b>: {len(tuned.candidates)} candidate block shapes"
    first = tuned.candidates[0].seconds
    # A 1-D block's threads are its one size: the column would repeat the block's.
    threads_column = any(len(c.block) > 1 for c in tuned.candidates)
    rows = []
    for i, c in enumerate(tuned.candidates):
        chosen = i == tuned.choice
        relative = "" if c.seconds is None or not first else f"{first / c.seconds:.2f}×"
        status = "chosen" if chosen else (escape(c.skipped) if c.skipped else "")
        style = f"color:{OK};font-weight:600" if chosen else ""
        values = dict(c.tune)
        rows.append((
            f'<span style="{style}">{"▶ " if chosen else ""}{escape(format_block(c.block))}</span>',
            *((str(math.prod(c.block)),) if threads_column else ()),
            *(escape(repr(values[n])) if n in values else "–" for n in names),
            format_time(c.seconds) if c.seconds is not None else "–",
            relative,
            f'<span style="{style}">{status}</span>',
        ))
    chosen = tuned.candidates[tuned.choice]
    summary = (f"chose {code(chosen.label())} ({escape(tuned.source)}"
               + (f"; {tuned.speedup:.2f}× the first candidate's speed" if tuned.speedup is not None else "")
               + f") for {escape(tuned.key_text)}")
    header = ("block", *(("threads",) if threads_column else ()), *(code(n) for n in names), "device time per call",
              "speed vs first", "")
    parts = [head + f": {summary}</div>", table(rows, header)]
    if tuned.seconds_total is not None:
        parts.append(f"<div>tuning took {format_time(tuned.seconds_total)} for this key "
                     f"({len(tuned.candidates)} candidates, compiles included)</div>")
    parts.append(note("The first candidate is the default (CPU simulator, CUDA-graph capture, torch.compile'd code, "
                      "PNEX_AUTOTUNE=0). "
                      "Choices are stored per GPU model and key; %%pnex --force times them again."))
    return "".join(parts)


#: Bar colours besides the op's (the accent) and the copy's (success): the eager reference, the DRAM peak.
_EAGER = "#a07cc5"
_PEAK = "var(--jp-layout-color4, #6b6b6b)"
_MARK = "var(--jp-content-font-color1, #333333)"


def _bar(fraction: float, colour: str, mark: float | None) -> str:
    """A bar ``fraction`` of its track long, with a line across it at ``mark`` (the
    verdict's threshold, 85% of the ceiling) where given."""
    width = max(0.0, min(1.0, fraction)) * 100
    line = "" if mark is None or not 0 < mark <= 1 else (
        f'<span style="position:absolute;left:{mark * 100:.1f}%;top:-3px;bottom:-3px;border-left:2px solid;'
        f'{themed("border-color", _MARK)}"></span>')
    return (
        f'<span style="position:relative;display:inline-block;width:14em;height:0.8em;border:1px solid;'
        f'{themed("border-color", BORDER)};vertical-align:middle"><span style="display:block;height:100%;'
        f'width:{width:.1f}%;{themed("background", colour)}"></span>{line}</span>'
    )


def efficiency_html(e: Efficiency, op_name: str, eager_name: str) -> str:
    """Bars of the op's and the eager reference's bandwidth beside the device's
    ceilings (what the memory allows at the call's mix, measured, and the DRAM peak),
    each as long as its share of the longest (the peak, where known) and labelled with
    its share of the ceiling, with a line at :data:`~pnex_magic.efficiency.FAR` of the
    ceiling; the verdict (at the ceiling, in green; near it; not judged) naming the
    ceiling and what reached it; below the line, the most likely reason, what to change
    (with the shape of the code where that helps) and the other reasons the figures
    show; last, what the ceiling is made of."""
    memory = "device-to-device copy" if e.copy_bandwidth else "DRAM peak"
    if e.memory is not None:
        memory = f"memory at this call's mix: {e.memory.label}"
    rows = [(code(op_name), e.op_bandwidth, ACCENT, True), (code(eager_name), e.eager_bandwidth, _EAGER, True),
            *((escape(name), rate, _EAGER, True) for name, rate in e.references),
            (escape(memory), e.memory_ceiling, OK, False)]
    if e.peak_bandwidth and e.memory_ceiling != e.peak_bandwidth:
        rows.append(("DRAM peak", e.peak_bandwidth, _PEAK, False))
    rows = [r for r in rows if r[1]]
    top = max(bw for _, bw, _, _ in rows) if rows else 1.0
    scale, scale_name = (e.peak_bandwidth, "peak") if e.peak_bandwidth and e.peak_bandwidth >= top else (top, "")
    mark = FAR * e.ceiling / scale if e.ceiling and scale else None
    body = []
    for label, bw, colour, timed in rows:
        shares = [f"{share_text(bw / scale)} of {scale_name}"] if scale_name and bw != scale else []
        if timed and e.ceiling:
            shares.append(f"{share_text(bw / e.ceiling)} of the ceiling")
        text = " · ".join([*shares, e.rate(bw)])
        body.append((label, _bar(bw / scale, colour, mark), f'<span style="white-space:nowrap">{escape(text)}</span>'))
    parts = [f"<div style=\"margin-top:6px\"><b>bandwidth against the device's limits</b> ({escape(e.device)})</div>",
             f'<div style="overflow-x:auto">{table(body)}</div>']
    if mark is not None:
        parts.append(note(escape(f"bar length: the share of {scale_name or 'the longest bar'}; the line across the bars: "
                                 f"{FAR:.0%} of the ceiling, below which the report says why")))
    if not e.judged:
        parts.append(f'<div style="margin-top:4px"><b>{escape(e.verdict.split(":", 1)[0])}</b>:'
                     f"{escape(e.verdict.split(':', 1)[1])}</div>")
    elif e.at_ceiling:
        parts.append(f'<div style="color:{OK};margin-top:4px"><b>at the ceiling</b>: {escape(e.verdict)}</div>')
    elif e.near:
        parts.append(f'<div style="margin-top:4px"><b>near the ceiling, not at it</b>: {escape(e.verdict)}</div>')
    found = e.explanation
    if found is not None:
        parts.append(f'<div style="color:{WARN};margin-top:4px"><b>why below {FAR:.0%} of the ceiling</b>: '
                     f"{escape(found.finding)}</div>")
        parts.append(f"<div><b>what to change</b>: {escape(found.advice)}</div>")
        if found.code:
            parts.append(pre(highlight(found.code, python_lexer())))
        if e.also:
            items = "".join(f"<li>{escape(r)}</li>" for r in e.also)
            parts.append(f'<div style="color:{FG_MUTED};margin:4px 0">also:<ul style="margin:2px 0">'
                         f"{items}</ul></div>")
    parts.append(note(escape(ceiling_text(e))))
    parts.append(note(escape(f"the peak: {e.peak_source}")))
    return "".join(parts)


def ceiling_text(e: Efficiency) -> str:
    """What the ceiling of ``e`` is, in words: the rule, its rate here and what reached it,
    and what the memory's share of it was measured with."""
    if e.memory is not None:
        memory = f"at this call's mix, {e.memory.source}; measured: {e.memory.listing(e.unit)}"
    elif e.copy_bandwidth:
        memory = "a device-to-device copy measured once per process (bytes read + written per second)"
    else:
        memory = "the DRAM peak (nothing measured)"
    here = f"{e.rate(e.ceiling)}, {e.ceiling_by}" if e.ceiling else "unknown"
    return (f"the ceiling is the fastest rate measured for this call, so that no rate shown here beats it: what the "
            f"memory allows at its mix of reads and writes, or a reference timed on its bytes where faster; here "
            f"{here}. The memory: {memory}")
