"""What a workload's run yields, and how it reads: :class:`Row` (one variant's time and
check) and :class:`Workload` (its variants and the goal they are held to), the variants'
standard names, the plain-text and Markdown tables, the goal lines and the comparisons in
words.  Pure Python (no torch import): the command line's ``--help`` may import it."""

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "Row", "Workload", "EAGER", "COMPILED", "COMPILED_GRAPHS", "FLOOR", "TIME_COLUMN", "SPEED_COLUMNS", "TIE",
    "goal_line", "versus", "host_share", "format_table", "markdown_table",
]


@dataclasses.dataclass
class Row:
    """One variant of a workload."""

    variant: str
    seconds: float | None  #: per step / per call, the minimum of the rounds' medians; None when it could not run
    check: str = ""  #: how its result compares with the eager reference
    note: str = ""
    rounds: list[float | None] = dataclasses.field(default_factory=list)  #: each round's median (None: failed)
    host_seconds: float | None = None  #: host time to issue one call (:func:`host_seconds`; measured on a GPU)

    @property
    def us(self) -> float | None:
        return None if self.seconds is None else self.seconds * 1e6


EAGER = "eager PyTorch"
COMPILED = "torch.compile"
COMPILED_GRAPHS = "torch.compile(mode='reduce-overhead')"
FLOOR = "memory floor (torch copy, same bytes)"


@dataclasses.dataclass
class Workload:
    """Every variant of one workload at one size, and the goal it is held to."""

    name: str
    size: str
    unit: str  #: what one time is: "per step", "per call", "forward+backward"
    rows: list[Row]
    headline: str = ""  #: the pnex variant the goal is about
    goal: str = ""
    goal_met: bool | None = None
    device: str = ""
    #: why the goal was missed, from the measured times (what failed, by how much, and the cause where the
    #: figures show it); "" where it was met or not judged
    goal_why: str = ""

    def seconds(self, variant: str) -> float | None:
        for row in self.rows:
            if row.variant == variant:
                return row.seconds
        return None

    def best(self, prefix: str) -> tuple[str, float | None]:
        """The fastest variant whose name starts with ``prefix``, and its time."""
        timed = [r for r in self.rows if r.variant.startswith(prefix) and r.seconds is not None]
        if not timed:
            return "", None
        fastest = min(timed, key=lambda r: r.seconds)
        return fastest.variant, fastest.seconds

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        for row in data["rows"]:
            row["us"] = None if row["seconds"] is None else row["seconds"] * 1e6
        return data


def _fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    us = seconds * 1e6
    if us >= 1e5:
        return f"{us / 1e3:,.1f} ms"
    return f"{us:,.1f} µs" if us < 1e3 else f"{us / 1e3:,.3f} ms"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return ""
    return f"{a / b:.2f}x"


#: The time column: each variant's time is the median of its runs within a round, and the table
#: gives its fastest round's (see :func:`_run_rounds`).
TIME_COLUMN = "time (fastest round's median)"
#: The ratio columns: all of them speeds, another time over this one, so each reads the same way:
#: above 1.00 this variant is faster.
SPEED_COLUMNS = ("× eager's speed", "× torch.compile's speed", "× the memory floor's speed")


def _table_rows(workloads: list[Workload]) -> tuple[list[str], list[list[str]]]:
    header = ["workload", "variant", TIME_COLUMN, *SPEED_COLUMNS, "goal", "check"]
    rows = []
    for w in workloads:
        eager = w.seconds(EAGER)
        compiled = w.seconds(COMPILED)
        floor = w.seconds(FLOOR)
        for r in w.rows:
            goal = ""
            if r.variant == w.headline and w.goal:
                verdict = {True: "MET", False: "NOT MET", None: "not judged"}[w.goal_met]
                goal = f"{verdict}: {w.goal}" + (f"; {w.goal_why}" if w.goal_why else "")
            rows.append([
                f"{w.name} {w.size} ({w.unit})",
                r.variant + (f" [{r.note}]" if r.note else ""),
                _fmt_us(r.seconds),
                "" if r.variant in (EAGER, FLOOR) else _ratio(eager, r.seconds),
                "" if r.variant in (COMPILED, FLOOR) else _ratio(compiled, r.seconds),
                "" if r.variant == FLOOR else _ratio(floor, r.seconds),
                goal,
                r.check,
            ])
    return header, rows


def goal_line(w: Workload) -> str:
    """The goal of ``w`` and whether this run met it, with why not (``w.goal_why``)."""
    if not w.goal:
        return f"{w.name} {w.size}: no goal judged (goals are judged on a GPU at full size)"
    verdict = {True: "MET", False: "NOT MET", None: "not judged"}[w.goal_met]
    return f"{w.name} {w.size}: goal {verdict}: {w.goal}" + (f"; {w.goal_why}" if w.goal_why else "")


#: Two times within this factor of each other are a tie: the rounds' spread is of this order.
TIE = 1.03


def versus(w: Workload, a: str, b: str) -> str:
    """``a`` against ``b`` in ``w``, in words computed from their times: which is faster
    and by how much, or a tie (within :data:`TIE`)."""
    ta, tb = w.seconds(a), w.seconds(b)
    if ta is None or tb is None:
        return f"{a} against {b}: not both timed"
    if max(ta, tb) <= TIE * min(ta, tb):
        how = "a tie"
    else:
        how = f"{tb / ta:.2f}x its speed: {'faster' if ta < tb else 'slower'}"
    return f"{a}: {_fmt_us(ta)} against {b}: {_fmt_us(tb)}; {how}"


def host_share(r: Row) -> str:
    """What share of ``r``'s time per call the host took to issue it, and what sets the pace."""
    if r.host_seconds is None or not r.seconds:
        return f"{r.variant}: host time not measured"
    share = r.host_seconds / r.seconds
    pace = "the host sets the pace (host-bound)" if share >= 0.8 else "the GPU sets the pace"
    return f"{r.variant}: the host takes {_fmt_us(r.host_seconds)} to issue a call of {_fmt_us(r.seconds)}: {pace}"


def format_table(workloads: list[Workload]) -> str:
    """The results as a plain-text table.  Every ratio is a speed, another variant's
    time over this one's: above 1.00, this variant is the faster ("× the memory floor's
    speed" 1.00: at the floor)."""
    header, rows = _table_rows(workloads)
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def markdown_table(workloads: list[Workload]) -> str:
    """The same table in Markdown (for notebooks: ``display(Markdown(...))``)."""
    header, rows = _table_rows(workloads)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _check_close(actual: "torch.Tensor", expected: "torch.Tensor", rtol: float) -> tuple[bool, str]:
    """Whether ``actual`` is within ``rtol`` of ``expected``'s largest value everywhere, and
    the largest difference in those words."""
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    scale = float(e.abs().max()) or 1.0
    err = float((a - e).abs().max()) / scale
    return err <= rtol, f"largest difference {err:.1e} of the largest reference value"
