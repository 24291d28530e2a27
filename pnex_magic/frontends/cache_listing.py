"""``%pnex_cache``: the build cache's entries, the stored autotune choices and what
else the cache folder holds as a result object (text and HTML), or what
``--clear`` removed."""

from __future__ import annotations

import dataclasses
import html
import time

from .. import cache
from ..launch.autotune import format_block
from ..timing import format_bytes

__all__ = ["CacheRow", "ChoiceRow", "CacheListing"]


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


@dataclasses.dataclass(frozen=True)
class CacheRow:
    kernel: str
    arch: str
    size_bytes: int
    age_seconds: float
    registers: int | None
    slot: str


@dataclasses.dataclass(frozen=True)
class ChoiceRow:
    """One stored autotune choice."""

    kernel: str
    gpu: str
    key: str
    choice: str
    speedup: float | None  #: the first candidate's time over the chosen one's
    age_seconds: float

    @classmethod
    def from_record(cls, data: dict, now: float) -> ChoiceRow:
        def label(block, tune) -> tuple:
            return tuple(block), tuple(v for _, v in tune) if tune and isinstance(tune[0], (list, tuple)) else tuple(tune)

        times = {label(c.get("block", ()), c.get("tune", ())): c.get("seconds") for c in data.get("candidates", ())}
        choice = tuple(data.get("choice", ()))
        tune = tuple(data.get("choice_tune", ()))
        first = next(iter(times.values()), None)
        chosen = times.get((choice, tune))
        names = [n for n, _ in next((c.get("tune", ()) for c in data.get("candidates", ())), ())]
        text = format_block(choice) if choice else "?"
        if tune:
            text += ", " + ", ".join(f"{n}={v!r}" for n, v in zip(names or ["?"] * len(tune), tune))
        return cls(
            kernel=str(data.get("kernel", "?")).removeprefix("__main__."),
            gpu=str(data.get("gpu", "?")),
            key=str(data.get("key_text", data.get("key_values", ""))),
            choice=text,
            speedup=first / chosen if first and chosen else None,
            age_seconds=max(0.0, now - float(data.get("created", now))),
        )


@dataclasses.dataclass(frozen=True)
class CacheListing:
    """The build cache's entries and autotune choices (``%pnex_cache``) with the other
    parts of the cache folder (:data:`pnex_magic.cache.PARTS`: items and bytes), or
    what ``--clear`` removed (:attr:`cleared`)."""

    directory: str
    rows: tuple[CacheRow, ...]
    cleared: cache.Cleared | None = None
    choices: tuple[ChoiceRow, ...] = ()
    others: dict[str, cache.Usage] = dataclasses.field(default_factory=dict)  #: the other parts, where not empty

    @property
    def removed(self) -> int | None:
        """Items removed by ``--clear``, all parts together (``None``: a listing)."""
        return None if self.cleared is None else self.cleared.total

    @classmethod
    def collect(cls, entries=None, cleared: cache.Cleared | None = None, choices=None,
                others: bool = False) -> CacheListing:
        rows = []
        now = time.time()
        for entry in entries or ():
            size = sum(p.stat().st_size for p in entry.path.iterdir() if p.is_file())
            res = entry.meta.get("resources") or {}
            rows.append(CacheRow(
                kernel=str(entry.meta.get("kernel", "?")).removeprefix("__main__."),
                arch=str(entry.meta.get("arch", "?")),
                size_bytes=size,
                age_seconds=max(0.0, now - float(entry.meta.get("created", now))),
                registers=res.get("registers"),
                slot=entry.path.name,
            ))
        picks = tuple(ChoiceRow.from_record(r.data, now) for r in choices or ())
        rest = {part: use for part, use in cache.usage().items()
                if part not in ("kernels", "autotune") and use.items} if others else {}
        return cls(str(cache.cache_dir()), tuple(rows), cleared, picks, rest)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __str__(self) -> str:
        if self.cleared is not None:
            return str(self.cleared)
        total = sum(r.size_bytes for r in self.rows)
        out = [f"pnex build cache {self.directory}: {len(self.rows)} entr{'y' if len(self.rows) == 1 else 'ies'}, "
               f"{format_bytes(total)}"]
        if self.rows:
            out.append(f"  {'kernel':<28} {'arch':<7} {'regs':>4} {'size':>9} {'age':>7}  slot")
            for r in self.rows:
                out.append(f"  {r.kernel[:28]:<28} {r.arch:<7} {'' if r.registers is None else r.registers:>4} "
                           f"{format_bytes(r.size_bytes):>9} {_age(r.age_seconds):>7}  {r.slot[:16]}")
        if self.choices:
            out.append(f"autotune choices: {len(self.choices)}")
            out.append(f"  {'kernel':<28} {'block':<12} {'gain':>6} {'age':>7}  gpu; key")
            for c in self.choices:
                gain = "" if c.speedup is None else f"{c.speedup:.2f}x"
                out.append(f"  {c.kernel[:28]:<28} {c.choice:<12} {gain:>6} {_age(c.age_seconds):>7}  {c.gpu}; {c.key}")
        if self.others:
            out.append(f"also: {self._others_text()}")
        return "\n".join(out)

    def _others_text(self) -> str:
        return ", ".join(f"{cache.describe(part, use.items)} ({format_bytes(use.bytes)})"
                         for part, use in self.others.items())

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("CacheListing(...)" if cycle else str(self))

    def _repr_html_(self) -> str:
        e = html.escape
        if self.cleared is not None:
            return f"<div>{e(str(self.cleared))}</div>"
        head = (f"<div>pnex build cache <code>{e(self.directory)}</code>: {len(self.rows)} entries, "
                f"{format_bytes(sum(r.size_bytes for r in self.rows))}</div>")
        parts = [head]
        if self.rows:
            parts.append(_table(("kernel", "arch", "registers", "size", "age", "slot"), [
                (f"<code>{e(r.kernel)}</code>", e(r.arch), "" if r.registers is None else str(r.registers),
                 format_bytes(r.size_bytes), _age(r.age_seconds), f"<code>{e(r.slot[:16])}</code>")
                for r in self.rows
            ]))
        if self.choices:
            parts.append(f"<div>autotune choices: {len(self.choices)}</div>")
            parts.append(_table(("kernel", "block", "speed vs first candidate", "GPU", "key", "age"), [
                (f"<code>{e(c.kernel)}</code>", f"<code>{e(c.choice)}</code>",
                 "" if c.speedup is None else f"{c.speedup:.2f}×", e(c.gpu), e(c.key), _age(c.age_seconds))
                for c in self.choices
            ]))
        if self.others:
            parts.append(f"<div>also: {e(self._others_text())}</div>")
        return "".join(parts)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    cell = "padding:1px 10px 1px 0;text-align:left"
    head = "".join(f'<th style="{cell}">{h}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{cell}">{c}</td>' for c in row) + "</tr>" for row in rows)
    return f'<table style="border-collapse:collapse;color:inherit"><tr>{head}</tr>{body}</table>'
