"""Logging, result checks and timing for ``benchmarks/jax_overhead.py``: ``log`` and ``save_text``
(also into ``$OUT``), ``check_fma`` (float32 against float64 within one rounding per product and
sum), ``median_seconds``, ``per_call_us`` and ``hlo_counts`` (copies, conditionals and custom
calls in compiled HLO text)."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path


# ---------------------------------------------------------------------------- helpers


def log(*parts) -> None:
    text = " ".join(str(p) for p in parts)
    print(text, flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(Path(out) / "jax_overhead.log", "a") as f:
            f.write(text + "\n")


def save_text(name: str, text: str) -> None:
    out = os.environ.get("OUT")
    if out:
        folder = Path(out) / "jax_hlo"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def check_fma(name: str, got, *, products=(), addends=(), reference) -> None:
    """``got`` (float32) against ``reference`` (float64) within one float32 rounding of
    each product and of the sum: ``eps * (sum |products| + sum |addends|)``, which
    admits a fused multiply-add as well as a product rounded first."""
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    scale = sum(np.abs(np.asarray(p, dtype=np.float64)) for p in products) + sum(
        np.abs(np.asarray(a, dtype=np.float64)) for a in addends)
    tol = np.finfo(np.float32).eps * scale + np.finfo(np.float32).tiny
    err = np.abs(got - reference)
    if not np.all(err <= tol):
        worst = int(np.argmax(err - tol))
        raise AssertionError(f"{name}: wrong result at {worst}: got {got.flat[worst]!r}, float64 "
                             f"{reference.flat[worst]!r}, tolerance {tol.flat[worst]:.3g}")


def median_seconds(run, repeats: int) -> tuple[float, list[float]]:
    """Median wall time of ``run()`` (which synchronises itself), after one warm-up."""
    run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), samples


def per_call_us(fn, args, *, calls: int, sync_each: bool) -> float:
    """Host time per call, in µs, of ``calls`` calls, each synchronised (``sync_each``) or
    one sync at the end."""
    start = time.perf_counter()
    if sync_each:
        for _ in range(calls):
            fn(*args).block_until_ready()
    else:
        for _ in range(calls):
            out = fn(*args)
        out.block_until_ready()
    return (time.perf_counter() - start) / calls * 1e6


def hlo_counts(text: str, shape: str | None = None) -> dict:
    """Copies (of arrays of ``shape``, e.g. ``f32[2000,2000]``, or all) in the while
    bodies and elsewhere, conditionals and custom calls of compiled HLO text."""
    import re

    bodies = set(re.findall(r"body=(%[\w.\-]+)", text))
    computations: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        head = re.match(r"(?:ENTRY )?(%[\w.\-]+) .*\{$", line)
        if head:
            name = head.group(1)
            computations[name] = []
        elif name is not None:
            computations[name].append(line)
    pattern = re.compile(r"= " + (re.escape(shape) if shape else r"\S+?") + r"(\{[^}]*\})? copy\(")
    in_body = sum(bool(pattern.search(line)) for n, lines in computations.items() if n in bodies for line in lines)
    total = sum(bool(pattern.search(line)) for lines in computations.values() for line in lines)
    return {"copies_in_while_body": in_body, "copies_elsewhere": total - in_body,
            "conditionals": text.count(" conditional("), "custom_calls": text.count(" custom-call(")}
