"""A notebook never states a measured figure that its outputs do not show (issue 36).

The notebooks ship the outputs of one GPU run (``benchmarks/run_notebooks.py``); their
prose is written once.  So the prose carries no measured figures of its own: every
figure with a unit of measure in a markdown cell (µs, ms, GB/s, TB/s, %, ×, MiB, ...)
must appear, number and unit, in that notebook's outputs, unless it is a constant of
pnex itself, read here from the code (the report's 85% threshold, the 95% the
bytes-in-flight advice aims at).  Code (inline or fenced) is not prose and is not
scanned; ``2000 × 2000`` is a size, not a ratio.

Besides, each notebook's outputs name what produced them (``Running on: NVIDIA ...``,
or the CPU and its simulator), and a goal a run missed says why next to it
(``NOT MET: <goal>; <why>``).  And where a table's time column says what statistic it
holds, the prose says the same.

And a report's verdict holds against every rate its cell shows (:func:`ceiling_contradictions`):
where a cell says an op is "at the ceiling" (or near it), no other rate in that cell's
outputs may be so much faster that the op is not (05_colab's muladd was "at or near the
ceiling" at 85% of a copy, beside torch.compile at 1.18× its rate).  The DRAM peak and the
report's list of streaming kernels (rates of other mixes of reads and writes) are not rates
of the cell's workload and are left out; other cells may time other workloads.

The checker is tested on planted figures, so that it cannot pass by finding nothing.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import nbformat
import pytest

from pnex_magic.ceiling import LISTING
from pnex_magic.efficiency import AT_CEILING, FAR
from pnex_magic.hardware import IN_FLIGHT_TARGET

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import workloads  # noqa: E402

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

_UNITS = r"µs|us|ms|ns|TB/s|GB/s|MB/s|TFLOP/s|GFLOP/s|GiB|MiB|KiB|GB|MB|kB|%|×(?!\s*\d)|x(?![\w\d])"
FIGURE = re.compile(r"(?<![\w.])(\d+(?:,\d{3})*(?:\.\d+)?)\s?(" + _UNITS + r")")
#: Figures that are pnex's own constants, not measurements.
CONSTANTS = {(f"{FAR * 100:.0f}", "%"), (f"{AT_CEILING * 100:.0f}", "%"), (f"{IN_FLIGHT_TARGET * 100:.0f}", "%")}
GPU_LINE = re.compile(r"(?im)^\s*running on:?\s+(nvidia [^\n]+|cpu\b[^\n]*simulator[^\n]*)")
NOT_MET = re.compile(r"NOT MET")
NOT_MET_WITH_WHY = re.compile(r"NOT MET: [^;|\n]+; [^|\n]*\w")
WHY_LINE = re.compile(r"\s+why: .*\w")


def figures(text: str) -> set[tuple[str, str]]:
    """``{("17.1", "µs"), ("3", "×")}``: each number with its unit (``x`` read as ``×``,
    ``us`` as ``µs``; thousands separators dropped)."""
    found = set()
    for number, unit in FIGURE.findall(text):
        unit = {"x": "×", "us": "µs"}.get(unit, unit)
        found.add((number.replace(",", ""), unit))
    return found


def prose(markdown: str) -> str:
    """A markdown cell's text without its code (fenced blocks and inline spans)."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    return re.sub(r"`[^`\n]*`", " ", text)


def output_text(nb) -> str:
    """Everything a notebook's outputs show, as text (HTML without its tags)."""
    return "\n".join(cell_output_text(cell) for cell in nb.cells)


def cell_output_text(cell) -> str:
    """Everything one cell's outputs show, as text (HTML without its tags)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
        data = out.get("data", {})
        for kind in ("text/plain", "text/markdown"):
            parts.append(str(data.get(kind, "")))
        if "text/html" in data:
            parts.append(html.unescape(re.sub(r"<[^>]+>", " ", str(data["text/html"]))))
    return "\n".join(parts)


_RATE = r"(\d+(?:,\d{3})*(?:\.\d+)?)\s?(TB/s|GB/s|MB/s)"
RATE = re.compile(r"(?<![\w.])" + _RATE)
#: A verdict that an op is at or near its ceiling: its share, the ceiling's rate (the report's
#: wording since the streaming ceiling) or none (the older "of the device-to-device copy"), the claim.
CLAIM = re.compile(r"(\d+)% of the (?:ceiling \(" + _RATE + r"[^)]*\)|device-to-device copy): "
                   r"(at the ceiling|near it|at or near the ceiling)")
OLD_CEILING = re.compile(r"ceiling\s*:\s*copy " + _RATE)  #: the older report's ceiling line
PEAK = re.compile(r"\bpeak\s+" + _RATE)  #: "peak 3.35 TB/s", "DRAM peak  3.35 TB/s": not a rate reached
STREAMS = re.compile(re.escape(LISTING) + r" \([^)]*\): [^;\n]*")  #: the report's kernels of other mixes


def _rate(number: str, unit: str) -> float:
    return float(number.replace(",", "")) * {"TB/s": 1e12, "GB/s": 1e9, "MB/s": 1e6}[unit]


def ceiling_contradictions(nb) -> list[str]:
    """Verdicts of "at the ceiling" (from :data:`AT_CEILING` of it) or near it (from
    :data:`FAR`) that a rate shown in the same cell's outputs belies: the op, at its
    share of the ceiling (rounded up), is below that threshold of the rate."""
    copies = [_rate(*m) for m in OLD_CEILING.findall(output_text(nb))]
    out: dict[str, None] = {}
    for i, cell in enumerate(nb.cells):
        text = cell_output_text(cell)
        peaks = {_rate(*m) for m in PEAK.findall(text)}
        shown = [r for r in (_rate(*m) for m in RATE.findall(STREAMS.sub(" ", text))) if r not in peaks]
        for m in CLAIM.finditer(text):
            ceiling = _rate(m.group(2), m.group(3)) if m.group(2) else max(copies, default=None)
            if ceiling is None:
                continue
            op = (int(m.group(1)) + 0.5) / 100 * ceiling
            need = AT_CEILING if m.group(4) == "at the ceiling" else FAR
            faster = [x for x in shown if op < need * x]
            if faster:
                out[f"cell {i}: the verdict {m.group(0)!r} puts the op at {op / 1e12:.3g} TB/s or less, while the "
                    f"cell shows {max(faster) / 1e12:.3g} TB/s, {max(faster) / op:.2f}× that: the ceiling is not "
                    f"the fastest rate shown"] = None
    return list(out)


def problems(nb) -> list[str]:
    """What in a notebook breaks the rules above, in words (empty: none)."""
    shown = output_text(nb)
    found = figures(shown) | CONSTANTS
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for figure in sorted(figures(prose(cell.source)) - found):
            out.append(f"markdown cell {i} states {''.join(figure)}, which no output shows")
    if not GPU_LINE.search(shown):
        out.append("no output names the GPU that produced it (a 'Running on: NVIDIA ...' line) or the CPU simulator")
    lines = shown.splitlines()
    for n, line in enumerate(lines):
        cells = line.split("|")
        # the reason on the line itself ("NOT MET: goal; why"), or on the next ("  why: ...")
        why_below = n + 1 < len(lines) and WHY_LINE.match(lines[n + 1])
        for part in cells if len(cells) > 1 else [line]:
            if NOT_MET.search(part) and not NOT_MET_WITH_WHY.search(part) and not why_below:
                out.append(f"a missed goal without its reason: {part.strip()[:160]!r}")
    said = " ".join(prose(c.source) for c in nb.cells if c.cell_type == "markdown")
    if workloads.TIME_COLUMN in shown and "fastest round" not in said:
        out.append(f"a table's time column is {workloads.TIME_COLUMN!r}, and the prose does not say 'fastest round'")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_prose_states_only_figures_its_outputs_show(path):
    nb = nbformat.read(path, as_version=4)
    found = problems(nb)
    assert not found, (f"{path.name}: " + "; ".join(found) + ". Put measured figures in a cell's output (computed, "
                       f"with a verdict) and keep the prose free of them; re-execute on the GPU machine: "
                       f"python benchmarks/run_notebooks.py {path.relative_to(REPO)}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_verdicts_hold_against_the_rates_they_show(path):
    found = ceiling_contradictions(nbformat.read(path, as_version=4))
    assert not found, (f"{path.name}: " + "; ".join(found) + ". Saved before the report's ceiling became the fastest "
                       f"rate measured for the call? Re-execute on the GPU machine: "
                       f"python benchmarks/run_notebooks.py {path.relative_to(REPO)}")


# --------------------------------------------------------------------------- the checker itself


def _notebook(markdown: str, output: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(markdown), nbformat.v4.new_code_cell("print(...)")]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    return nb


GOOD_OUTPUT = "Running on: NVIDIA H200 (CUDA 13.0)\nthe loop: 17.09 µs a step, 1.07x the op's speed, 48 MiB\n"


def test_the_checker_reads_figures_and_units():
    assert figures("measured 17.1 µs against 18.3 us; 1,234.5 GB/s; 4 × faster, 3x; 2000 × 2000; 95%") == {
        ("17.1", "µs"), ("18.3", "µs"), ("1234.5", "GB/s"), ("4", "×"), ("3", "×"), ("95", "%")}
    assert prose("a `fori_loop(unroll=8)` of 2 µs\n```\nx = 3 ms\n```") .count("µs") == 1
    assert figures(prose("in code: `16 MiB`")) == set()


def test_the_checker_accepts_prose_without_figures_or_with_shown_ones():
    assert problems(_notebook("The loop is faster; the table says by how much.", GOOD_OUTPUT)) == []
    assert problems(_notebook("It took 17.09 µs, 1.07× the op's speed, on 48 MiB.", GOOD_OUTPUT)) == []
    assert problems(_notebook(f"Below {FAR:.0%} of the ceiling the report says why.", GOOD_OUTPUT)) == []


def test_the_checker_flags_a_figure_the_outputs_do_not_show():
    """06_jax's old prose: 17.1 µs per step, while its table showed 93.9."""
    found = problems(_notebook("which measured 17.1 µs per step against 18.3 µs without it on an H200",
                               GOOD_OUTPUT.replace("17.09", "93.9")))
    assert found == ["markdown cell 0 states 17.1µs, which no output shows",
                     "markdown cell 0 states 18.3µs, which no output shows"]
    assert problems(_notebook("an H100's or H200's 50 MiB of L2", GOOD_OUTPUT)) == [
        "markdown cell 0 states 50MiB, which no output shows"]


def test_the_checker_wants_the_gpu_named_and_missed_goals_explained():
    assert problems(_notebook("", "the loop: 17.09 µs\n")) == [
        "no output names the GPU that produced it (a 'Running on: NVIDIA ...' line) or the CPU simulator"]
    assert problems(_notebook("", "Running on: CPU (CUDA simulator): no GPU here\n")) == []
    bare = GOOD_OUTPUT + "| k-means | pnex kernel | 73.6 µs | NOT MET: within 1.3x of the floor and faster |  |\n"
    assert problems(_notebook("", bare)) == [
        "a missed goal without its reason: 'NOT MET: within 1.3x of the floor and faster'"]
    explained = bare.replace("faster |", "faster; torch.compile is faster: 60.0 µs against 73.6 µs |")
    assert problems(_notebook("", explained)) == []
    printed = GOOD_OUTPUT + "pnex / cuBLAS = 0.57x: goal 0.75x NOT MET\n"
    assert problems(_notebook("", printed)) == ["a missed goal without its reason: 'pnex / cuBLAS = 0.57x: goal 0.75x NOT MET'"]
    assert problems(_notebook("", printed + "  why: cuBLAS feeds its tiles through TMA\n")) == []
    assert problems(_notebook("", printed + "  why:\n")) != []


def test_the_goal_lines_carry_their_reason():
    """What workloads.goal_line prints for a missed goal passes the check; a met one too."""
    w = workloads.Workload("k-means", "10 points", "per call", [workloads.Row("pnex kernel", 8e-5)],
                           headline="pnex kernel", goal="within 1.3x of the floor", goal_met=False,
                           goal_why="torch.compile is faster")
    line = workloads.goal_line(w)
    assert NOT_MET_WITH_WHY.search(line), line
    table = workloads.markdown_table([w])
    assert problems(_notebook("Each time is the fastest round's.", GOOD_OUTPUT + line + "\n" + table)) == []
    assert problems(_notebook("Each time is the median.", GOOD_OUTPUT + table))[0].startswith("a table's time column")


def _cells(*outputs: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(...)") for _ in outputs]
    for cell, text in zip(nb.cells, outputs):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    return nb


#: 05_colab's H100 run: the report's copy, and the cell that timed torch.compile beside the op.
COLAB_REPORT = "  ceiling   : copy 2.84 TB/s (measured), peak 3.35 TB/s on NVIDIA H100 80GB HBM3\n"
COLAB_TABLE = ("| pnex muladd | 83 µs | 2,426 GB/s |\n| eager a * b + 0.5 | 118 µs | 1,708 GB/s |\n"
               "| torch.compile | 70.3 µs | 2,866 GB/s |\n")


def test_the_checker_flags_a_verdict_a_faster_rate_in_its_cell_belies():
    """05_colab as saved: "at or near the ceiling" at 85% of a copy, beside torch.compile at 1.18× the op."""
    old = _cells(COLAB_REPORT, COLAB_TABLE + "the pnex kernel's report: 85% of the device-to-device copy: at or near "
                                             "the ceiling\n")
    assert ceiling_contradictions(old) == [
        "cell 1: the verdict '85% of the device-to-device copy: at or near the ceiling' puts the op at 2.43 TB/s or "
        "less, while the cell shows 2.87 TB/s, 1.18× that: the ceiling is not the fastest rate shown"]
    # the same claim in today's words, against a ceiling the table beats: flagged too
    new = _cells(COLAB_TABLE + "85% of the ceiling (2.84 TB/s, the device-to-device copy): near it, not at it\n")
    assert len(ceiling_contradictions(new)) == 1
    # against the streaming ceiling the op is below 85%: no claim, nothing to belie
    below = _cells(COLAB_TABLE + "84% of the ceiling (2.87 TB/s, torch's add at this call's mix): below 85% of it\n")
    assert ceiling_contradictions(below) == []
    # "at the ceiling" needs 95% of every rate shown; "near it", 85%
    at = "97% of the ceiling (2.87 TB/s, torch's add at this call's mix): at the ceiling\n"
    assert ceiling_contradictions(_cells(at + "torch.compile: 2.9 TB/s\n")) == []
    assert len(ceiling_contradictions(_cells(at + "torch.compile: 3 TB/s\n"))) == 1
    near = "88% of the ceiling (2.87 TB/s, torch's add at this call's mix): near it, not at it\n"
    assert ceiling_contradictions(_cells(near + "torch.compile: 2.9 TB/s\n")) == []
    assert len(ceiling_contradictions(_cells(near + "torch.compile: 3 TB/s\n"))) == 1


def test_the_checker_leaves_out_the_peak_other_mixes_and_other_cells():
    verdict = "97% of the ceiling (2.87 TB/s, torch's add at this call's mix): at the ceiling"
    report = (f"  ceiling   : 2.87 TB/s, torch's add at this call's mix, on NVIDIA H100 80GB HBM3\n"
              f"  memory    : {LISTING} (float32 tensors of 200 MiB each, the fastest of 10 runs, once per process): "
              f"fill 2.71, copy 2.84, scale 2.85, add 2.87, addcmul 2.9, sum 3.1 TB/s; peak 3.35 TB/s\n"
              f"  verdict   : {verdict}\n DRAM peak     3.35 TB/s\n")
    assert ceiling_contradictions(_cells(report)) == []
    assert ceiling_contradictions(_cells(report, "a read-only kernel elsewhere: 3.1 TB/s\n")) == []
    assert len(ceiling_contradictions(_cells(report + "a kernel of this call's mix: 3.1 TB/s\n"))) == 1
