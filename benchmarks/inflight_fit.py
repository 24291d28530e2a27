"""Fits the report's bytes-in-flight model to measured copies (issue 30), and prints
what it predicts for the recorded GPUs.  Needs no GPU.

    python benchmarks/inflight_fit.py [--probe FILE ...] [--published FILE]

The model (``pnex_magic.hardware.in_flight_share``): an SM keeping ``b`` bytes of
loads in flight reaches the share ``x / (1 + x**3) ** (1/3)`` of the copy's
bandwidth, ``x = b / (R × L / SMs)`` with ``R`` the read bandwidth at the ceiling and
``L`` a latency under load, one per architecture (``hardware.LOADED_LATENCY``).  For
each measured series, this script fits ``L`` (least squares on the share) and gives
the largest error of the table's ``L``:

* ``--probe``: ``python benchmarks/probes.py inflight`` results (default: every
  ``benchmarks/results/inflight-<date>-<gpu>.json``): blocks of 256 threads, single
  loads and float32/float64 vectors (several narrow loads per thread, u8 x 4 or
  f16 x 2, reach less than their bytes allow);
* ``--published``: RRZE-HPC gpu-benches' stream kernels, transcribed in
  ``benchmarks/results/inflight-published-gpu-benches.json`` (blocks up to 512).

Then, for each recorded profile (``pnex_magic.profiles``), the share a float32 copy
with 1, 2, 4 and 8 elements per thread in blocks of 256 can reach, and the bytes per
SM that reach 95%.  Writes ``benchmarks/results/inflight-fit-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", nargs="*", type=Path, help="probes.py inflight results (default: all in results/)")
    parser.add_argument("--published", type=Path, default=RESULTS / "inflight-published-gpu-benches.json")
    parser.add_argument("--no-write", action="store_true", help="print only")
    return parser


def probe_series(path: Path) -> dict:
    """A probes.py inflight result as a series: (bytes in flight per SM, share of the clone)."""
    data = json.loads(path.read_text())
    points = [(r["bytes_in_flight_per_sm"], r["share_of_clone"]) for r in data["records"]
              if r["tpb"] == 256 and (r["dtype"] in ("f32", "f64") or r["items"] == 1)]
    clone = statistics_median([2 * (1 << 30) / r["clone_seconds"] for r in data["records"]])
    return dict(name=f"{data['gpu']} ({path.name})", arch=data["arch"], sm_count=data["sm_count"], ceiling=clone,
                points=points)


def published_series(path: Path) -> list[dict]:
    """gpu-benches' series: two blocks of ``block`` threads per SM, 8 bytes each."""
    doc = json.loads(path.read_text())
    out = []
    for name, s in doc["series"].items():
        rates = {p["block"]: p["gb_per_s"] * 1e9 for p in s["points"]}
        ceiling = s.get("ceiling_gb_per_s", max(rates.values()) / 1e9) * 1e9
        out.append(dict(name=f"{name} (gpu-benches {s['file']})", arch=s["arch"], sm_count=s["sm_count"],
                        ceiling=ceiling, points=[(16 * b, r / ceiling) for b, r in rates.items() if b <= 512]))
    return out


def statistics_median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def fit(series: dict) -> tuple[float, float, float]:
    """(fitted L in seconds, its rms error, the largest error of the table's L)."""
    from pnex_magic.hardware import in_flight_share, loaded_latency

    def errors(latency: float) -> list[float]:
        knee = series["ceiling"] / 2 / series["sm_count"] * latency  # a copy: half the bytes are read
        return [in_flight_share(b, knee) - share for b, share in series["points"]]

    best = min(range(200, 2001, 5), key=lambda ns: sum(e * e for e in errors(ns * 1e-9)))
    rms = math.sqrt(sum(e * e for e in errors(best * 1e-9)) / len(series["points"]))
    table = loaded_latency(series["arch"])
    worst = max(abs(e) for e in errors(table)) if table else math.nan
    return best * 1e-9, rms, worst


def predictions() -> list[dict]:
    """The share of the copy a float32 copy with 1 to 8 elements per thread can reach on
    each recorded profile (blocks of 256, full occupancy)."""
    from pnex_magic.hardware import in_flight_needed, in_flight_share, loaded_latency, max_threads_per_sm
    from pnex_magic.profiles import PROFILES

    out = []
    for p in PROFILES.values():
        knee = p.copy_bandwidth / 2 / p.sm_count * loaded_latency(p.arch)
        threads = max_threads_per_sm(p.arch)
        out.append(dict(profile=p.name, arch=p.arch, knee_bytes=knee, bytes_for_95=in_flight_needed(knee),
                        shares={items: in_flight_share(threads * 4 * items, knee) for items in (1, 2, 4, 8)}))
    return out


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    probes = ns.probe if ns.probe is not None else sorted(
        p for p in RESULTS.glob("inflight-*.json") if not p.name.startswith(("inflight-published", "inflight-fit")))
    series = [probe_series(p) for p in probes] + published_series(ns.published)
    rows = []
    print(f"{'series':<58} {'arch':<6} {'fitted L':>9} {'rms':>6} {'table L':>8} {'worst error':>11}")
    from pnex_magic.hardware import loaded_latency

    for s in series:
        latency, rms, worst = fit(s)
        table = loaded_latency(s["arch"])
        rows.append(dict(series=s["name"], arch=s["arch"], fitted_latency=latency, rms=rms, table_latency=table,
                         worst_error=worst))
        print(f"{s['name'][:58]:<58} {s['arch']:<6} {latency * 1e9:7.0f} ns {rms:6.3f} {table * 1e9:6.0f} ns "
              f"{worst:11.3f}")
    print(f"\n{'profile':<10} {'knee':>8} {'95% at':>8}   share of the copy, float32, 1 / 2 / 4 / 8 per thread")
    predicted = predictions()
    for p in predicted:
        shares = " / ".join(f"{v:.2f}" for v in p["shares"].values())
        print(f"{p['profile']:<10} {p['knee_bytes'] / 1024:6.1f} KiB {p['bytes_for_95'] / 1024:5.1f} KiB   {shares}")
    if not ns.no_write:
        path = RESULTS / f"inflight-fit-{_dt.date.today().isoformat()}.json"
        path.write_text(json.dumps(dict(benchmark="inflight-fit", date=_dt.datetime.now(_dt.timezone.utc).isoformat(
            timespec="seconds"), series=rows, predictions=predicted), indent=1))
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
