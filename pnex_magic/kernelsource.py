"""A kernel's source as a syntax tree, and a function built back from a rewritten tree.

The AST utilities that every source transformation of a kernel shares (the checked
variant, :mod:`pnex_magic.checking`; the simulator's typed rewrite,
:mod:`pnex_magic.simtyping`; the derived backward, :mod:`pnex_magic.adjoint`), in a
module of their own below all three, so that importing one does not import the others:

* :func:`kernel_source`: the kernel's ``def`` parsed from its file, its lines
  numbered as in that file (a ``%%pnex`` cell's pseudo-file numbers lines from the
  cell's first), so that a site or an error names the line the user wrote;
* :func:`namespace_of`: the values the kernel's names resolve to outside it, its
  globals and its closure's cells;
* :func:`plain_signature` and :func:`rebuild`: a rewritten ``def`` compiled into a
  function with the kernel's name, file, line numbers, globals and closure values,
  ready for Numba (the one ``exec`` of the package's source transformations);
* :func:`with_parameters`: the kernel with more trailing parameters, names it read
  as globals before (the device arrays a kernel reads, passed as hidden arguments,
  :mod:`pnex_magic.snapshot`);
* :func:`bound_names` (every name a piece of code binds) and :func:`range_call`
  (the arguments of ``range(...)`` as written).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import textwrap
import types
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import KernelDefinitionError

__all__ = [
    "KernelSource", "kernel_source", "namespace_of", "plain_signature", "rebuild", "with_parameters", "bound_names",
    "range_call",
]



@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A kernel's ``def`` as parsed (line numbers as in its file) and its lines."""

    fdef: ast.FunctionDef
    lines: Mapping[int, str]  #: line number in the file -> that line, without its newline
    first: int  #: the number of the ``def``'s first line (its first decorator's)


def kernel_source(fn: types.FunctionType, what: str = "a checked variant",
                  asked_by: str = "check=True, %%pnex --check, PNEX_CHECK=1") -> KernelSource:
    """The source of kernel ``fn``.  ``what`` is built from it and ``asked_by`` says how
    a user asks for it: the errors name both.

    Raises
    ------
    KernelDefinitionError
        ``fn`` has no source here (made by ``exec`` of a string), or its source is not
        a plain ``def`` of that name.
    """
    name = getattr(fn, "__name__", repr(fn))
    _register_command_line_source(fn)
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise KernelDefinitionError(
            f"kernel {name!r}: {what} ({asked_by}) is built from the kernel's Python source, and there is none here ({exc}). "
            f"Define the kernel in a file or a notebook cell, not with exec() of a string"
        ) from None
    text = "".join(lines)
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        tree = ast.parse("if 1:\n" + text)  # an indented def whose strings break dedent
        tree.body = tree.body[0].body  # type: ignore[attr-defined]
        ast.increment_lineno(tree, -1)
    fdef = tree.body[0] if tree.body else None
    # the def's own name (a function renamed after its def keeps it in its code object)
    if not isinstance(fdef, ast.FunctionDef) or fdef.name != fn.__code__.co_name:
        raise KernelDefinitionError(
            f"kernel {name!r}: {what} needs the kernel's source as a plain 'def {name}(...)' "
            f"statement; inspect found {type(fdef).__name__ if fdef is not None else 'nothing'}"
        )
    ast.increment_lineno(fdef, first - 1)
    return KernelSource(fdef, {first + k: line.rstrip("\n") for k, line in enumerate(lines)}, first)


def _register_command_line_source(fn: types.FunctionType) -> None:
    """A kernel defined in ``python -c "..."`` has its source in the command line
    (``sys.orig_argv``), not in a file: register it in :mod:`linecache` under the file
    name its code carries (``<string>``), as IPython registers a cell's, when its
    ``def`` is there at the code's first line (else, an ``exec`` of another string,
    nothing is registered and the source stays missing)."""
    import linecache
    import sys

    code = getattr(fn, "__code__", None)
    argv = getattr(sys, "orig_argv", None) or []
    if code is None or code.co_filename != "<string>" or "-c" not in argv[:-1] or "<string>" in linecache.cache:
        return
    text = argv[argv.index("-c") + 1]
    lines = text.splitlines(True)
    line = lines[code.co_firstlineno - 1] if 0 < code.co_firstlineno <= len(lines) else ""
    decorated = line.lstrip().startswith("@")
    if decorated or line.lstrip().startswith(f"def {code.co_name}("):
        linecache.cache["<string>"] = (len(text), None, lines, "<string>")


def namespace_of(fn: types.FunctionType) -> dict[str, Any]:
    """What ``fn``'s free names resolve to: its globals, overridden by its closure's
    values (an empty cell is left out)."""
    values = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        with contextlib.suppress(ValueError):
            values[name] = cell.cell_contents
    return values


def plain_signature(fdef: ast.FunctionDef) -> None:
    """Drop ``fdef``'s decorators, annotations, defaults and return annotation, in place:
    a kernel built from it is launched with every argument, by position."""
    args = fdef.args
    for a in args.posonlyargs + args.args:
        a.annotation = None
    args.defaults = []
    fdef.decorator_list = []
    fdef.returns = None
    fdef.type_comment = None


_FACTORY = "__pnex_factory"


def rebuild(fn: types.FunctionType, fdef: ast.FunctionDef, extra_globals: Mapping[str, Any] = (),
            what: str = "a checked variant", filename: str | None = None) -> types.FunctionType:
    """``fdef`` (a rewritten form of kernel ``fn``'s ``def``) compiled into a function
    with ``fn``'s file name, qualified name, module and docstring, reading ``fn``'s
    globals (plus ``extra_globals``) and ``fn``'s closure values.

    The ``def`` is nested in a factory whose parameters are ``fn``'s free variables,
    and the factory is called with the closure's values, so the new function's free
    names resolve as ``fn``'s did when it is built.  ``what`` names the new function
    in the error below.  ``filename``: the file the new function's code names instead
    of ``fn``'s (a generated source registered in :mod:`linecache`, whose line numbers
    ``fdef`` carries: :mod:`pnex_magic.adjoint`'s derived backward).

    Raises
    ------
    KernelDefinitionError
        A free variable of ``fn`` has no value yet.
    """
    freevars = list(fn.__code__.co_freevars)
    ret = ast.Return(value=ast.Name(id=fdef.name, ctx=ast.Load()))
    factory = ast.FunctionDef(
        name=_FACTORY,
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=v) for v in freevars], kwonlyargs=[],
                           kw_defaults=[], defaults=[]),
        body=[fdef, ret],
        decorator_list=[],
        returns=None,
    )
    if "type_params" in ast.FunctionDef._fields:  # Python 3.12+
        factory.type_params = []
    ast.copy_location(factory, fdef)
    ast.copy_location(ret, fdef)
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, filename or fn.__code__.co_filename, "exec", dont_inherit=True)
    namespace = dict(fn.__globals__)
    namespace.update(extra_globals)
    exec(code, namespace)  # noqa: S102 - the one exec: code built above from the kernel's own AST
    make = namespace.pop(_FACTORY)
    cells = []
    for name, cell in zip(freevars, fn.__closure__ or ()):
        try:
            cells.append(cell.cell_contents)
        except ValueError:
            raise KernelDefinitionError(
                f"kernel {fn.__name__!r}: its free variable {name!r} has no value yet; {what} is built from the "
                f"closure's values"
            ) from None
    new = make(*cells)
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    # The tree it was built from: a later transformation (the CUDA simulator's typed rewrite,
    # pnex_magic.simtyping) starts from it, as inspect would find the original def in the file.
    new.__pnex_tree__ = fdef
    return new


def with_parameters(fn: types.FunctionType, names: Iterable[str]) -> types.FunctionType:
    """Kernel ``fn`` with ``names`` appended to its parameters (which drop their
    annotations and defaults: the launch passes every argument): a name the body read
    as a global or closure variable is now the parameter.  Line numbers, globals and
    closure values stay ``fn``'s.

    Raises
    ------
    KernelDefinitionError
        ``fn`` has no Python source here (see :func:`kernel_source`).
    """
    names = list(names)
    what = f"the kernel's form that takes the device array(s) {', '.join(names)} as arguments"
    source = kernel_source(fn, what, "a device array read as a global")
    fdef = source.fdef
    plain_signature(fdef)
    fdef.args.args += [ast.arg(arg=name) for name in names]
    return rebuild(fn, fdef, what=what)


def bound_names(nodes: Iterable[ast.AST]) -> set[str]:
    """Every name a statement or expression among ``nodes`` (or inside them) binds."""
    names: set[str] = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                names.update(node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
    return names


def range_call(node: ast.expr) -> tuple[ast.expr, ...] | None:
    """The arguments of a call written ``range(...)`` (1 to 3, positional, none
    starred); whether ``range`` is the builtin there is for the caller to say
    (:meth:`pnex_magic.checking.bindings.Bindings.builtin`)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and not node.keywords and 1 <= len(node.args) <= 3
            and not any(isinstance(a, ast.Starred) for a in node.args)):
        return tuple(node.args)
    return None
