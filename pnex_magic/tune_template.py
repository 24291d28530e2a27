"""The code the report's "what to change" shows for more elements per thread, in the
kernel's own shape.

:func:`tune_template` writes the timed kernel again with a ``Tune`` parameter
``ITEMS``: each thread handles ``ITEMS`` elements, block-strided along the last
launch axis it has (x for a 1-D launch, y for a 2-D one, so that a warp still reads
32 neighbours of one row), every load issued before the first store.  It keeps the
kernel's name, parameters, dimensionality and bounds test; for an element-wise
kernel (``cuda.grid`` unpacked, then one ``if`` whose body reads each input at the
thread's own index) the body is the kernel's own, with each input read from the
registers the loads filled.  Any other 1-D or 2-D kernel gets the same shape with
a copy as its body; a 3-D launch, or a kernel that already has a ``Tune``
parameter, gets none (the report then shows the generic shape, :data:`TUNE_SHAPE`).
"""

from __future__ import annotations

import ast
import textwrap

from .spec import KernelSpec, TensorParam

__all__ = ["tune_template", "TUNE_SHAPE"]

_ITEMS = "ITEMS"

#: The shape of a kernel that gives each thread ``ITEMS`` independent elements: block-strided
#: (a warp's 32 threads read 32 neighbours at each step, as with one element per thread), every
#: load issued before the first store, so that ``ITEMS`` loads per thread are in flight at once.
TUNE_SHAPE = """\
@pnex.jit(n_threads="(a.numel() + ITEMS - 1) // ITEMS", threads_per_block="auto")
def kernel(a: In("f32", (None,)), r: Out("f32", "a"), ITEMS: pnex.Tune(1, 2, 4, 8)):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    v = cuda.local.array(ITEMS, float32)
    for k in range(ITEMS):              # every load first: ITEMS loads in flight per thread
        j = base + k * cuda.blockDim.x  # block-strided: a warp reads 32 neighbours
        if j < a.shape[0]:
            v[k] = a[j]
    for k in range(ITEMS):              # then every store
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            r[j] = v[k]
# not j = i * ITEMS + k: a thread's consecutive elements make each warp load uncoalesced"""


def tune_template(spec: KernelSpec, source: str = "") -> str:
    """The kernel of ``spec`` (its Python ``source`` where there is one) rewritten to
    give each thread ``ITEMS`` independent elements, as text; ``""`` where no template
    in the kernel's own shape can be written."""
    axes = len(spec.n_threads)
    if axes not in (1, 2) or spec.tune_params or _ITEMS in {p.name for p in spec.params}:
        return ""
    tensors = [p for p in spec.params if isinstance(p, TensorParam)]
    inputs = [p for p in tensors if p.role in ("in", "inmut")]
    outputs = [p for p in tensors if p.role in ("out", "inmut")]
    if not inputs or not outputs or any(p.ndim != axes or p.dtype.is_record for p in tensors):
        return ""
    fn = _function(source, spec.name)
    found = _elementwise(fn, axes, {p.name for p in inputs}) if fn is not None else None
    if found is not None:
        names, index, test, body, read = found
        header = _header(fn)
    else:
        names = ("i",) if axes == 1 else ("x", "y")
        index = names[0] if axes == 1 else "y, x"
        first, out = inputs[0], outputs[0]
        bounds = [f"{names[0]} < {out.name}.shape[0]"] if axes == 1 else [
            f"y < {out.name}.shape[0]", f"x < {out.name}.shape[1]"]
        test = " and ".join(bounds)
        read = [first.name]
        body = [f"{out.name}[{index}] = {first.name}_v[k]  # the kernel's work on element [{index}]"]
        header = None
    inner = names[-1]  # the axis each thread takes ITEMS elements along
    block = "cuda.blockDim.x" if axes == 1 else "cuda.blockDim.y"
    n_threads = [str(e) for e in spec.n_threads]
    n_threads[-1] = f"({n_threads[-1]} + {_ITEMS} - 1) // {_ITEMS}"
    launch = repr(n_threads[0]) if axes == 1 else f"({', '.join(map(repr, n_threads))})"
    params = header or ", ".join(f"{p.name}: {p.describe()}" for p in spec.params)
    dtypes = {p.name: p.dtype.numba_name for p in inputs}
    params = f"{params}, {_ITEMS}: pnex.Tune(1, 2, 4, 8)"
    if len(params) > 80:  # one parameter a line, as the kernels are written
        params = "\n" + "".join(f"    {p},\n" for p in _split(params))
    lines = [f'@pnex.jit(n_threads={launch}, threads_per_block="auto")', f"def {spec.name}({params}):"]
    if axes == 1:
        lines.append(f"    base = cuda.blockIdx.x * cuda.blockDim.x * {_ITEMS} + cuda.threadIdx.x")
    else:
        lines += [f"    {names[0]} = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
                  f"    base = cuda.blockIdx.y * cuda.blockDim.y * {_ITEMS} + cuda.threadIdx.y"]
    lines += [f"    {name}_v = cuda.local.array({_ITEMS}, {dtypes[name]})" for name in read]
    along = "a warp reads 32 neighbours" if axes == 1 else "a warp still reads 32 neighbours of a row"
    lines += [f"    for k in range({_ITEMS}):  # every load first: {_ITEMS} loads in flight per thread",
              f"        {inner} = base + k * {block}  # block-strided: {along}",
              f"        if {test}:"]
    lines += [f"            {name}_v[k] = {name}[{index}]" for name in read]
    lines += [f"    for k in range({_ITEMS}):  # then the work, and every store",
              f"        {inner} = base + k * {block}",
              f"        if {test}:"]
    lines += ["            " + line for stmt in body for line in stmt.splitlines()]
    note = ("# not consecutive elements per thread (i * ITEMS + k): every load of a warp would be uncoalesced"
            if axes == 1 else "# ITEMS rows per thread, not ITEMS neighbours in a row: a warp's loads stay coalesced")
    lines.append(note)
    return "\n".join(lines)


def _split(params: str) -> list[str]:
    """``a: In("f32", (None, None)), c: float`` → its parameters (commas in brackets kept)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(params):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(params[start:i].strip())
            start = i + 1
    out.append(params[start:].strip())
    return out


def _function(source: str, name: str) -> ast.FunctionDef | None:
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _header(fn: ast.FunctionDef) -> str:
    """The kernel's parameters as written (annotations included)."""
    args = ast.arguments(posonlyargs=[], args=fn.args.args, vararg=None, kwonlyargs=[], kw_defaults=[],
                         kwarg=None, defaults=fn.args.defaults)
    return ast.unparse(args)


def _grid_names(stmt: ast.stmt, axes: int) -> tuple[str, ...] | None:
    """``i = cuda.grid(1)`` → ``("i",)``; ``x, y = cuda.grid(2)`` → ``("x", "y")``."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    if not (ast.unparse(call.func) == "cuda.grid" and len(call.args) == 1
            and isinstance(call.args[0], ast.Constant) and call.args[0].value == axes):
        return None
    target = stmt.targets[0]
    if axes == 1 and isinstance(target, ast.Name):
        return (target.id,)
    if axes > 1 and isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        names = tuple(e.id for e in target.elts)
        return names if len(names) == axes else None
    return None


def _index_key(node: ast.expr) -> tuple[str, ...] | None:
    """The names an index is made of: ``a[i]`` → ``("i",)``, ``a[y, x]`` → ``("y", "x")``."""
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Name) for e in node.elts):
        return tuple(e.id for e in node.elts)
    return None


class _Registers(ast.NodeTransformer):
    """Reads of the inputs at the thread's own index become reads of the registers the
    loads filled (``a[y, x]`` → ``a_v[k]``); any other read of an input fails the match."""

    def __init__(self, inputs: set[str], index: tuple[str, ...]):
        self.inputs = inputs
        self.index = index
        self.read: list[str] = []
        self.other = False

    def visit_Subscript(self, node: ast.Subscript):
        if isinstance(node.value, ast.Name) and node.value.id in self.inputs:
            if isinstance(node.ctx, ast.Load):
                if _index_key(node.slice) != self.index:
                    self.other = True
                    return node
                if node.value.id not in self.read:
                    self.read.append(node.value.id)
                return ast.Subscript(ast.Name(f"{node.value.id}_v", ast.Load()), ast.Name("k", ast.Load()), ast.Load())
            if _index_key(node.slice) != self.index:  # an InMut written elsewhere
                self.other = True
        return self.generic_visit(node)


def _elementwise(fn: ast.FunctionDef, axes: int, inputs: set[str]):
    """``(grid names, index, bounds test, body statements, inputs read)`` of an element-wise
    kernel: ``cuda.grid`` unpacked, then one ``if`` whose body reads each input only at
    the thread's own index (the same index tuple every time); else ``None``."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 2 or not isinstance(body[1], ast.If) or body[1].orelse:
        return None
    names = _grid_names(body[0], axes)
    if names is None:
        return None
    guard = body[1]
    indices = {_index_key(n.slice) for n in ast.walk(guard) if isinstance(n, ast.Subscript)
               and isinstance(n.value, ast.Name) and n.value.id in inputs}
    if len(indices) != 1 or None in indices or set(next(iter(indices))) != set(names):
        return None
    index = next(iter(indices))
    rewrite = _Registers(inputs, index)
    new_body = [rewrite.visit(ast.parse(ast.unparse(s)).body[0]) for s in guard.body]
    if rewrite.other or not rewrite.read:
        return None
    for name in ast.walk(guard.test):  # the test may read inputs' shapes, not their elements
        if isinstance(name, ast.Subscript) and isinstance(name.value, ast.Name) and name.value.id in inputs:
            return None
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | {a.arg for a in fn.args.args}
    if taken & {"k", "base", *(f"{name}_v" for name in rewrite.read)}:  # the template's own names
        return None
    return names, ", ".join(index), ast.unparse(guard.test), [ast.unparse(s) for s in new_body], rewrite.read
