"""``%pnex_cache``: the build cache's entries as a result object (text and HTML)."""

from __future__ import annotations

import dataclasses
import html
import time

from .. import cache
from ..timing import format_bytes

__all__ = ["CacheRow", "CacheListing"]


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
class CacheListing:
    """The build cache's entries (``%pnex_cache``), or how many were removed."""

    directory: str
    rows: tuple[CacheRow, ...]
    removed: int | None = None

    @classmethod
    def collect(cls, entries=None, removed: int | None = None) -> CacheListing:
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
        return cls(str(cache.cache_dir()), tuple(rows), removed)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __str__(self) -> str:
        if self.removed is not None:
            entries = "entry" if self.removed == 1 else "entries"
            return f"pnex build cache {self.directory}: removed {self.removed} {entries}"
        total = sum(r.size_bytes for r in self.rows)
        out = [f"pnex build cache {self.directory}: {len(self.rows)} entr{'y' if len(self.rows) == 1 else 'ies'}, "
               f"{format_bytes(total)}"]
        if self.rows:
            out.append(f"  {'kernel':<28} {'arch':<7} {'regs':>4} {'size':>9} {'age':>7}  slot")
            for r in self.rows:
                out.append(f"  {r.kernel[:28]:<28} {r.arch:<7} {'' if r.registers is None else r.registers:>4} "
                           f"{format_bytes(r.size_bytes):>9} {_age(r.age_seconds):>7}  {r.slot[:16]}")
        return "\n".join(out)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("CacheListing(...)" if cycle else str(self))

    def _repr_html_(self) -> str:
        e = html.escape
        if self.removed is not None:
            return f"<div>pnex build cache <code>{e(self.directory)}</code>: removed {self.removed} entries</div>"
        head = (f"<div>pnex build cache <code>{e(self.directory)}</code>: {len(self.rows)} entries, "
                f"{format_bytes(sum(r.size_bytes for r in self.rows))}</div>")
        if not self.rows:
            return head
        cell = "padding:1px 10px 1px 0;text-align:left"
        rows = "".join(
            f'<tr><td style="{cell}"><code>{e(r.kernel)}</code></td><td style="{cell}">{e(r.arch)}</td>'
            f'<td style="{cell}">{"" if r.registers is None else r.registers}</td>'
            f'<td style="{cell}">{format_bytes(r.size_bytes)}</td><td style="{cell}">{_age(r.age_seconds)}</td>'
            f'<td style="{cell}"><code>{e(r.slot[:16])}</code></td></tr>'
            for r in self.rows
        )
        header = "".join(f'<th style="{cell}">{h}</th>' for h in ("kernel", "arch", "registers", "size", "age", "slot"))
        return f'{head}<table style="border-collapse:collapse;color:inherit"><tr>{header}</tr>{rows}</table>'
