"""The import graph of a package, drawn from its source (no module is imported).

``Layout.of(package_dir)`` reads every ``*.py`` file under the package with
:mod:`ast` and records one edge per ``import`` / ``from ... import`` that names a
module of the package (relative or absolute), *eager* when the statement runs at
import time (module level, a class body, a ``try``) and *lazy* when it sits in a
function.  Imports under ``if TYPE_CHECKING:`` are left out: they never run.
``from pkg import name`` is an edge to the module ``pkg.name`` when there is one,
else to ``pkg``; importing a module of a sub-package also runs that sub-package's
``__init__`` (and its parents' up to the importer's own), which counts as an edge
of the same kind.

From the graph:

* **floors**: a module's floor is 0 when it imports nothing of the package
  eagerly, else one more than the highest floor it imports eagerly;
* **up arrows**: lazy imports of a module that is not below the importer (its
  floor is the importer's or higher), except from the roof;
* **cycles**: strongly connected groups of modules, lazy imports counted too (a
  lazy import runs later, but a cycle through it is still a cycle of concerns).

The **roof** is what sits above every stage by design: the package facade
(``__init__.py`` of the package itself, whose PEP 562 ``__getattr__`` exports
import the front ends when a name is first read) and the entry scripts of child
processes (``__main__.py``, ``_sanitize_child.py``, ``_profile_child.py``), which
import the package as any user does.  Their lazy imports are not up arrows.

``python tests/import_layout.py [package_dir]`` prints the figures.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

#: Modules above every stage by design (see the module's docstring), relative to the package.
ROOF = ("", "__main__", "_sanitize_child", "_profile_child")


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's edge: ``source`` imports ``target``."""

    source: str
    target: str
    lazy: bool
    line: int  #: the statement's first line in ``source``'s file


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@dataclasses.dataclass(repr=False)
class Layout:
    package: str
    files: dict[str, Path]  #: module name -> file
    imports: list[Import]

    def __repr__(self) -> str:
        return f"<import layout of {self.package}: {len(self.files)} modules, {len(self.imports)} imports>"

    @classmethod
    def of(cls, package_dir: Path | str) -> Layout:
        root = Path(package_dir).resolve()
        package = root.name
        files: dict[str, Path] = {}
        for path in sorted(root.rglob("*.py")):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
        layout = cls(package, files, [])
        for module, path in files.items():
            layout.imports += layout._read(module, path)
        return layout

    # ------------------------------------------------------------------ reading
    def _is_package(self, module: str) -> bool:
        return self.files[module].name == "__init__.py"

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".") if self._is_package(module) else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def _targets(self, module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in self.files:
                    yield alias.name
            return
        base = self._absolute(module, node)
        for alias in node.names:
            if f"{base}.{alias.name}" in self.files:
                yield f"{base}.{alias.name}"
            elif base in self.files:
                yield base

    def _with_parents(self, module: str, target: str) -> Iterator[str]:
        """``target`` and the sub-packages importing it runs first (not the importer's own)."""
        yield target
        parts = target.split(".")
        for k in range(2, len(parts)):
            parent = ".".join(parts[:k])
            if parent in self.files and not (module == parent or module.startswith(parent + ".")):
                yield parent

    def _read(self, module: str, path: Path) -> list[Import]:
        found: list[Import] = []

        def walk(node: ast.AST, lazy: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _type_checking(child):
                    for stmt in child.orelse:
                        walk_one(stmt, lazy)
                    continue
                walk_one(child, lazy)

        def walk_one(child: ast.AST, lazy: bool) -> None:
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in self._targets(module, child):
                    for t in self._with_parents(module, target):
                        if t != module:
                            found.append(Import(module, t, lazy, child.lineno))
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            walk(child, inner)

        walk(ast.parse(path.read_text(), str(path)), False)
        return found

    # ------------------------------------------------------------------ figures
    def edges(self, *, lazy: bool | None = None) -> dict[str, set[str]]:
        """``module -> modules it imports`` (``lazy``: only lazy or only eager edges)."""
        out: dict[str, set[str]] = {m: set() for m in self.files}
        for imp in self.imports:
            if lazy is None or imp.lazy == lazy:
                out[imp.source].add(imp.target)
        return out

    def cycles(self) -> list[list[str]]:
        """Groups of modules that import each other, lazy imports counted (Tarjan)."""
        graph = self.edges()
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        groups: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in sorted(graph[v]):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1 or v in graph[v]:
                    groups.append(sorted(group))

        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 10 * len(self.files) + 100))
        try:
            for v in sorted(graph):
                if v not in index:
                    visit(v)
        finally:
            sys.setrecursionlimit(old)
        return groups

    def floors(self) -> dict[str, int]:
        """Each module's floor over the eager imports (a module in an eager cycle gets
        the floor its other imports give it)."""
        eager = self.edges(lazy=False)
        floor: dict[str, int] = {}
        visiting: set[str] = set()

        def of(v: str) -> int:
            if v in floor:
                return floor[v]
            if v in visiting:
                return -1
            visiting.add(v)
            floor[v] = 1 + max((of(w) for w in eager[v]), default=-1)
            visiting.discard(v)
            return floor[v]

        for v in self.files:
            of(v)
        return floor

    def roof(self) -> set[str]:
        return {".".join(p for p in (self.package, name) if p) for name in ROOF} & set(self.files)

    def up_arrows(self) -> list[Import]:
        """Lazy imports of a module that is not below the importer, roof excluded; one
        per statement."""
        floor = self.floors()
        roof = self.roof()
        seen: set[tuple[str, str, int]] = set()
        out = []
        for imp in self.imports:
            key = (imp.source, imp.target, imp.line)
            if imp.lazy and imp.source not in roof and floor[imp.target] >= floor[imp.source] and key not in seen:
                seen.add(key)
                out.append(imp)
        return out

    def commented(self, imp: Import) -> bool:
        """Whether the import's line, or the line above it, holds a comment."""
        text = self.files[imp.source].read_text()
        lines = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                 if tok.type == tokenize.COMMENT}
        return imp.line in lines or imp.line - 1 in lines

    def sizes(self) -> dict[str, int]:
        """Lines per module."""
        return {m: len(p.read_text().splitlines()) for m, p in self.files.items()}

    def figures(self) -> dict[str, object]:
        floor = self.floors()
        up = self.up_arrows()
        return {
            "modules": len(self.files),
            "floors": 1 + max(floor.values(), default=-1),
            "up_arrows": len({(i.source, i.target) for i in up}),
            "up_arrow_statements": [f"{i.source} -> {i.target} (line {i.line})" for i in up],
            "cycles": self.cycles(),
            "over_600_lines": sorted((n, m) for m, n in self.sizes().items() if n > 600),
        }


def main(argv: list[str]) -> int:
    package_dir = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "pnex_magic"
    for name, value in Layout.of(package_dir).figures().items():
        if isinstance(value, list) and value:
            print(f"{name}: {len(value)}")
            for item in value:
                print(f"    {item}")
        else:
            print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
