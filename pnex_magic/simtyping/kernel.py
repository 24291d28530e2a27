"""One typed simulation: a kernel and the device functions it calls, each rewritten
for the types it is called with, then checked against Numba's own typing.

:func:`typed_kernel` takes the kernel as the simulator would run it (the snapshot's
function, its checked variant, or its form with hidden arguments as parameters) and
the Numba types of its parameters (what the GPU compile is given), and returns the
same kernel with every conversion Numba makes written in (:mod:`.statements`).  A
``@cuda.jit(device=True)`` function it calls is rewritten once per argument types
(:meth:`Build.device`), as Numba compiles it once per signature.

Then :meth:`Build.cross_check` types the same functions with Numba's own type
inference (its untyped passes and ``NopythonTypeInference``, not its lowering: tens
of milliseconds, no CUDA toolkit needed) and compares, variable by variable, the
types the rewrite gave with the types Numba gave: a difference is an error, never a
silent difference between the CPU and the GPU.
"""

from __future__ import annotations

import ast
import copy
import logging
import types
from typing import Any

from ..kernelsource import bound_names, kernel_source, namespace_of, plain_signature, rebuild
from ..errors import KernelLaunchError, KernelTypingError
from ..snapshot import DeviceFunction
from . import numba_types as T
from .statements import Walker
from .stored import dumps, function_identity
from .values import Emitter, Val

__all__ = ["typed_kernel", "Build", "param_val"]

log = logging.getLogger(__name__)


def param_val(ty: Any) -> Val:
    """A kernel parameter of Numba type ``ty`` as the simulator passes it: a scalar
    as a NumPy scalar of its type, a ``Tune`` value (``Omitted``) as the Python
    constant Numba types as a literal."""
    t = T.nb()
    if isinstance(ty, t.Omitted):
        value = ty.value
        lit = T.typeof_value(value)
        return Val(lit, const=value, elems=tuple(Val(T.typeof_value(v), const=v, py=True) for v in value)
                   if isinstance(value, tuple) else None, py=isinstance(value, (int, float, bool)))
    if isinstance(ty, t.NoneType):
        return Val(ty, const=None)
    if T.is_scalar(ty):
        return Val(ty, exact=True)
    if isinstance(ty, t.BaseTuple):
        return Val(ty, elems=tuple(Val(e) for e in ty))
    return Val(ty)


class Build:
    """The typed forms made for one kernel (and its device functions)."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self._devices: dict[tuple, tuple[DeviceFunction, tuple, Val]] = {}
        self._busy: set[tuple] = set()
        #: (device function or None for the kernel, Numba's signature, walker): what the cross-check compares
        self.checked: list[tuple[DeviceFunction | None, tuple, Walker]] = []
        #: (the original function's identity, None for the kernel; rewritten def; recipe of its
        #: extra globals), callees first: what :mod:`.stored` keeps
        self.records: list[tuple[tuple | None, ast.FunctionDef, dict]] = []
        self._index: dict[int, int] = {}  # id of a typed device function -> its place in records

    def function(self, fn: types.FunctionType, params: list[Val], what: str, returns: bool,
                 device: DeviceFunction | None = None, numba_sig: tuple | None = None,
                 ) -> tuple[types.FunctionType, Walker, Any]:
        """``fn`` rewritten for parameters ``params``; ``returns``: it returns a value
        (a device function), whose type is found by a first walk."""
        tree = getattr(fn, "__pnex_tree__", None)
        if tree is not None:
            fdef = copy.deepcopy(tree)
            lines = dict(getattr(fn, "__pnex_lines__", {}))
        else:
            source = kernel_source(fn, f"the CUDA simulator's typed form of {what}", "running it on CPU tensors")
            fdef, lines = source.fdef, dict(source.lines)
        plain_signature(fdef)
        args = fdef.args
        if args.vararg or args.kwarg or args.kwonlyargs:
            raise KernelLaunchError(f"kernel {self.kernel!r}: {what} takes positional parameters only")
        names = [a.arg for a in args.posonlyargs + args.args]
        if len(params) != len(names):
            raise KernelLaunchError(f"kernel {self.kernel!r}: {what} takes {len(names)} parameters, "
                                    f"the simulator passes {len(params)}")
        namespace = namespace_of(fn)
        local_names = bound_names(fdef.body) | set(names)
        param_vals = dict(zip(names, params))
        em = Emitter(self.kernel, fn.__code__.co_filename, lines)
        return_type = None
        if returns:
            first = Walker(self, em, namespace, local_names, param_vals)
            first.recording = False
            first.block(copy.deepcopy(fdef.body), dict(param_vals))
            return_type = self._return_type(first, fdef, em)
        walker = Walker(self, em, namespace, local_names, param_vals, return_type)
        for name, val in param_vals.items():
            walker.record(name, val.ty)
        body, _ = walker.block(fdef.body, dict(param_vals))
        if not returns:
            body = self._unwrapped(names, params, em, fdef) + body
        fdef.body = body or [ast.Pass()]
        ast.fix_missing_locations(fdef)
        new = rebuild(fn, fdef, em.globals, what=what)
        self.checked.append((device, numba_sig if numba_sig is not None else tuple(v.ty for v in params), walker))
        self.records.append((None if device is None else function_identity(device.function), fdef, dict(em.recipe)))
        return new, walker, return_type

    def _unwrapped(self, names: list[str], params: list[Val], em: Emitter, fdef: ast.FunctionDef) -> list[ast.stmt]:
        """``a = unwrap(a)`` for each array parameter: the NumPy array the simulator's
        wrapper holds (its indexing costs microseconds a call; NumPy's, a tenth).  An
        array of records keeps its wrapper, whose elements' fields read as attributes."""
        t = T.nb()
        out = []
        for name, val in zip(names, params):
            if isinstance(val.ty, t.Array) and not isinstance(val.ty.dtype, t.Record):
                call = ast.Call(func=em.helper(("unwrap",), "unwrap"), args=[ast.Name(id=name, ctx=ast.Load())],
                                keywords=[])
                out.append(ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=call),
                                             fdef.body[0] if fdef.body else fdef))
        return out

    def _return_type(self, walker: Walker, fdef: ast.FunctionDef, em: Emitter) -> Any:
        t = T.nb()
        tys = {T.unliteral(v.ty) for v in walker.returns}
        if not tys:
            return t.none
        if len(tys) > 1 and t.none in tys:
            raise em.fail(fdef, "a device function that returns a value on some paths and nothing on others")
        unified = T.unify(*tys)
        if unified is None:
            raise em.fail(fdef, f"a device function whose returns have types {', '.join(map(str, tys))}",
                          typing=True)
        return unified

    def device(self, node: ast.AST, device: DeviceFunction, args: list[Val]) -> tuple[DeviceFunction, tuple, Val]:
        """The device function ``device`` rewritten for arguments ``args``: the frozen
        device function to call (the caller binds it to a global name), the types its
        parameters take (the caller converts to them) and its result."""
        import inspect

        sig = inspect.signature(device.function)
        params = list(sig.parameters.values())
        if len(args) > len(params):
            raise KernelTypingError(f"kernel {self.kernel!r}: {device.function.__name__}() takes {len(params)} "
                                    f"arguments, {len(args)} given", lineno=getattr(node, "lineno", None))
        types_ = [T.unliteral(v.ty) for v in args]
        vals = [Val(ty, exact=True) if T.is_scalar(ty) else Val(ty, elems=v.elems) for ty, v in zip(types_, args)]
        for p in params[len(args):]:
            if p.default is inspect.Parameter.empty:
                raise KernelTypingError(f"kernel {self.kernel!r}: {device.function.__name__}() is missing the "
                                        f"argument {p.name!r}", lineno=getattr(node, "lineno", None))
            vals.append(param_val(T.nb().Omitted(p.default)))
        numba_sig = tuple(types_) + tuple(T.nb().Omitted(p.default) for p in params[len(args):])
        key = (id(device.function), tuple(v.ty for v in vals))
        found = self._devices.get(key)
        if found is None:
            if key in self._busy:
                raise KernelLaunchError(f"kernel {self.kernel!r}: {device.function.__name__} calls itself; "
                                        "the simulator's typing does not follow recursion")
            self._busy.add(key)
            try:
                what = f"its device function {device.function.__name__!r}"
                new, _, ret = self.function(device.function, vals, what, returns=True, device=device,
                                            numba_sig=numba_sig)
            finally:
                self._busy.discard(key)
            result = Val(ret, exact=T.is_scalar(ret)) if not isinstance(ret, T.nb().BaseTuple) else \
                Val(ret, elems=tuple(Val(e) for e in ret))
            found = self._devices[key] = (DeviceFunction(new, device.options, device.original), tuple(types_), result)
            self._index[id(found[0])] = len(self.records) - 1
        return found

    def identity(self, typed: DeviceFunction) -> tuple:
        """How a stored form names a typed device function: its place among the records."""
        return (self._index[id(typed)],)

    # ------------------------------------------------------------------ cross-check

    def cross_check(self, kernel_fn: types.FunctionType, argtypes: tuple) -> None:
        """Compare every rewritten function's variable types with Numba's."""
        from .crosscheck import numba_variable_types

        found_all = numba_variable_types(kernel_fn, argtypes, [(d, s) for d, s, _ in self.checked], self.kernel)
        if found_all is None:
            return
        for (device, _, walker), found in zip(self.checked, found_all):
            fn_name = device.function.__name__ if device is not None else "the kernel"
            for name, numba_types in found.items():
                if name not in walker.local_names:  # Numba's own (a loop over a tuple made a loop over its indices)
                    continue
                ours = walker.assigned.get(name, set())
                joined = walker.joined.get(name, set())
                if _differ(ours, joined, numba_types) and _differ(*(
                        {T.unliteral(t) for t in tys} for tys in (ours, joined, numba_types))):
                    # (told apart by literal-ness alone, they compute alike: Numba holds a literal integer in
                    # its unliteral type; the target of a loop over literal_unroll(tuple) is one literal per copy)
                    raise KernelLaunchError(
                        f"kernel {self.kernel!r}: in {fn_name}, the CUDA simulator's typing of the variable "
                        f"{name!r} ({', '.join(sorted(str(t) for t in ours | joined))}) is not Numba-CUDA's "
                        f"({', '.join(sorted(str(t) for t in numba_types))}), so it would not compute what the GPU "
                        f"computes; please report this kernel to pnex_magic. It runs on a GPU as it is"
                    )


def _differ(ours: set, joined: set, numba_types: set) -> bool:
    """Whether a variable's types in the rewrite (assigned, or made at joins) are not Numba's."""
    return any(t not in numba_types for t in ours) or any(t not in ours and t not in joined for t in numba_types)


def typed_kernel(fn: types.FunctionType, argtypes: tuple, name: str, cross_check: bool = True,
                 stored: list | None = None) -> types.FunctionType:
    """Kernel ``fn`` rewritten so that the CUDA simulator computes with Numba-CUDA's
    types for parameters of Numba types ``argtypes`` (see the module docstring);
    ``stored``: a list the form to store (:func:`.stored.dumps`) is appended to."""
    T.refresh()
    build = Build(name)
    params = [param_val(ty) for ty in argtypes]
    new, _, _ = build.function(fn, params, "the kernel", returns=False)
    if cross_check:
        build.cross_check(fn, tuple(argtypes))
    if stored is not None:
        stored.append(dumps(build.records))
    return new
