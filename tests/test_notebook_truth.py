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

The checker is tested on planted figures, so that it cannot pass by finding nothing.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import nbformat
import pytest

from pnex_magic.efficiency import FAR
from pnex_magic.hardware import IN_FLIGHT_TARGET

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import workloads  # noqa: E402

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

_UNITS = r"µs|us|ms|ns|TB/s|GB/s|MB/s|TFLOP/s|GFLOP/s|GiB|MiB|KiB|GB|MB|kB|%|×(?!\s*\d)|x(?![\w\d])"
FIGURE = re.compile(r"(?<![\w.])(\d+(?:,\d{3})*(?:\.\d+)?)\s?(" + _UNITS + r")")
#: Figures that are pnex's own constants, not measurements.
CONSTANTS = {(f"{FAR * 100:.0f}", "%"), (f"{IN_FLIGHT_TARGET * 100:.0f}", "%")}
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
    parts = []
    for cell in nb.cells:
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
