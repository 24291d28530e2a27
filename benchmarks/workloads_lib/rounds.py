"""How every variant of a workload is run: in interleaved rounds, so that drift on a shared
machine hits them all alike (:func:`_run_rounds`), and which variants won each round
(:func:`_each_round`).  Also the two settings the command line changes: :data:`ROUNDS`
(``--rounds``) and :data:`_TRACEBACKS`.  Pure Python, like :mod:`workloads_lib.results`."""

import traceback
from collections.abc import Callable

from workloads_lib.results import Row, Workload

__all__ = ["DEFAULT_ROUNDS", "ROUNDS"]

DEFAULT_ROUNDS = 5

_TRACEBACKS = False  # the command line prints the traceback of a failed variant


ROUNDS = DEFAULT_ROUNDS  #: rounds of every variant, interleaved (``--rounds``)


def _run_rounds(rows: list[Row], variants: list[tuple[str, Callable[[], Row | float]]], rounds: int | None = None) -> None:
    """Run every variant once per round, the rounds interleaved (round r starts at the
    r-th variant), so that drift on a shared machine hits every variant alike.  Each run
    is a median over its own repeats; a row's time is the minimum of its rounds' medians
    (all of them in ``Row.rounds``), its check the last round's.  A variant that fails is
    not run again and becomes a row saying so (the others still run)."""
    rounds = ROUNDS if rounds is None else rounds
    samples: dict[str, list[float | None]] = {name: [] for name, _ in variants}
    last: dict[str, Row] = {}
    failed: dict[str, str] = {}
    for r in range(rounds):
        start = r % len(variants)
        for name, fn in variants[start:] + variants[:start]:
            if name in failed:
                samples[name].append(None)
                continue
            try:
                result = fn()
            except Exception as exc:  # report, do not hide, a variant that failed
                if _TRACEBACKS:
                    traceback.print_exc()
                failed[name] = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
                samples[name].append(None)
                continue
            row = result if isinstance(result, Row) else Row(name, result)
            samples[name].append(row.seconds)
            last[name] = row
    for name, _ in variants:
        row = last.get(name)
        if row is None:
            rows.append(Row(name, None, note=failed.get(name, "FAILED"), rounds=samples[name]))
            continue
        timed = [t for t in samples[name] if t is not None]
        row.seconds = min(timed) if timed else None
        row.rounds = samples[name]
        if name in failed:
            row.note = f"{failed[name]} (after {len(timed)} round(s))"
        rows.append(row)


def _each_round(workload: "Workload", mine: list[str], others: list[str]) -> list[bool | None]:
    """Per round: whether the fastest of the ``mine`` rows beat every one of ``others``
    (None where a row has no time that round)."""
    by_name = {r.variant: r.rounds for r in workload.rows}
    verdicts: list[bool | None] = []
    for i in range(max((len(v) for v in by_name.values()), default=0)):
        def at(name: str) -> float | None:
            times = by_name.get(name) or []
            return times[i] if i < len(times) else None

        ours = [at(n) for n in mine if at(n) is not None]
        theirs = [at(n) for n in others]
        verdicts.append(None if not ours or None in theirs else all(min(ours) < t for t in theirs))
    return verdicts
