"""The rows of ``benchmarks/first_use_phases.py`` (minimum and median over rounds per phase) and
the tables it prints."""

from __future__ import annotations

import statistics

from first_use_phases_lib.phases import KERNEL_PHASES, TYPING_SETUP


def _stats(values: list[float]) -> dict:
    return {"min_s": min(values), "median_s": statistics.median(values)}


def summarise(samples: list[dict], device: str) -> list[dict]:
    rows = [
        {"row": "import pnex_magic", "section": "imports", **_stats([s["import_pnex_s"] for s in samples])},
        {"row": "from numba import cuda (the user's)", "section": "imports",
         **_stats([s["import_numba_cuda_s"] for s in samples])},
    ]
    names = list(KERNEL_PHASES)
    for s in samples:
        for which in ("first", "second"):
            names += [p for p in s[which]["phases"] if p not in names]
    for phase in names:
        row = {"row": phase, "section": "new kernel"}
        for which in ("first", "second"):
            values = [s[which]["phases"].get(phase, 0.0) for s in samples]
            row[which] = _stats(values)
        if phase in ("first call", "C++ launcher load") and device != "cuda":
            row["skipped"] = "GPU only: without one the first call runs in the CUDA simulator"
        elif all(row[w]["median_s"] == 0.0 for w in ("first", "second")) and phase not in KERNEL_PHASES[:4]:
            continue
        rows.append(row)
    gc_row = {"row": "of which Python's garbage collection (all phases)", "section": "new kernel"}
    for which in ("first", "second"):
        gc_row[which] = _stats([sum(v[1] for v in s[which]["gc"].values()) for s in samples])
        gc_row[f"{which}_full_collections"] = [s[which]["gc"].get("2", [0])[0] for s in samples]
    rows.append(gc_row)
    full_phases: list[str] = []
    for s in samples:
        for which in ("first", "second"):
            for p, *_ in s[which].get("full_collections", []):
                if p not in full_phases:
                    full_phases.append(p)
    for phase in full_phases:  # where the full collections came, and what they cost there
        row = {"row": f"  full collections in: {phase}", "section": "new kernel"}
        for which in ("first", "second"):
            found = [[f for f in s[which].get("full_collections", []) if f[0] == phase] for s in samples]
            row[which] = _stats([sum(f[1] for f in fs) for fs in found])
            row[f"{which}_count"] = [len(fs) for fs in found]
            # what each freed and how many objects were frozen meanwhile (absent in older files)
            row[f"{which}_collected"] = [[f[2] for f in fs if len(f) > 3] for fs in found]
            row[f"{which}_frozen"] = [[f[3] for f in fs if len(f) > 3] for fs in found]
        rows.append(row)
    for which in ("first", "second"):
        rows.append({"row": f"total, {which} kernel (define to first result)", "section": "total",
                     **_stats([s[which]["seconds"] for s in samples])})
    rows.append({"row": "script: import pnex_magic to the first result", "section": "total",
                 **_stats([s["script_s"] for s in samples])})
    background: dict[str, list[float]] = {}
    for s in samples:
        for phase, sec in s["first"]["background"].items():
            background.setdefault(phase, []).append(sec)
    for phase, values in background.items():
        values += [0.0] * (len(samples) - len(values))
        rows.append({"row": f"background thread: {phase}", "section": "background", **_stats(values)})
    return rows


def print_rows(rows: list[dict], device: str, rounds: int, source: str = "") -> None:
    print(f"\nfirst use by phase{source}, fresh processes, {device}, {rounds} rounds (min / median, s; "
          f"each phase's exclusive wall time on the main thread)")
    print(f"{'phase':52s} {'1st min':>8} {'1st med':>8} {'2nd min':>8} {'2nd med':>8}")
    for r in rows:
        if "first" in r:
            if r.get("skipped"):
                print(f"{r['row']:52s} {'skipped: ' + r['skipped']}")
                continue
            f, s = r["first"], r["second"]
            print(f"{r['row']:52s} {f['min_s']:8.3f} {f['median_s']:8.3f} {s['min_s']:8.3f} {s['median_s']:8.3f}")
        else:
            print(f"{r['row']:52s} {r['min_s']:8.3f} {r['median_s']:8.3f}")


COMPARED = (TYPING_SETUP, "of which Python's garbage collection (all phases)",
            "total, first kernel (define to first result)", "script: import pnex_magic to the first result")


def print_comparison(results: dict[str, dict], device: str, rounds: int) -> None:
    """The main rows of every checkout and variant, side by side (min / median, s)."""
    print(f"\nchecked side by side ({device}, {rounds} interleaved rounds each; min / median, s)")
    print(f"{'checkout or variant':32s}" + "".join(f" {name.split(' (')[0][:26]:>27s}" for name in COMPARED))
    for name, found in results.items():
        rows = {r["row"]: r for r in found["rows"]}
        cells = []
        for row_name in COMPARED:
            row = rows.get(row_name, {})
            stats = row.get("first", row)
            cells.append(f"{stats.get('min_s', 0.0):.3f} / {stats.get('median_s', 0.0):.3f}" if stats else "-")
        print(f"{name[:32]:32s}" + "".join(f" {c:>27s}" for c in cells))
