"""The backward kernel's body, written from the forward's statements (:mod:`.ir`).

Two passes, as Warp's adjoint kernels do:

1. **the forward replay**: the forward kernel's statements again, over the same inputs,
   so that every value the derivatives need is in a register.  Nothing is written (the
   outputs exist already); what no derivative needs, NVVM removes.
2. **the reverse pass**: the statements in reverse order, each adding its partial
   derivatives (:mod:`.rules`) to its arguments' adjoints (``adj_<value>``).  An ``if``
   runs the reverse of the branch the forward took (its condition was stored); a value
   merged after it passes its adjoint to the branch's value.  Reads of ``In`` tensors
   add into their :class:`~pnex_magic.adjoint.ownership.Accumulator`, written out where
   its block's reverse ends; writes of ``Out`` tensors read the incoming gradient.

**Gathers.** A gradient gathered from the neighbours (:mod:`.ownership`) adds copies before
those two passes, one per offset of the reads: the replay and the reverse pass of the
neighbour's thread (the coordinates shifted, its own names), which keep only the adjoints
of its reads of this thread's element.

**Loops.** The replay runs every loop forward, whole.  The reverse pass runs the trips
backwards, and each trip first *recomputes* its own values (the body's replay) from
what does not change between trips: the loop's variable, the kernel's inputs and the
values computed before the loop.  Nothing is stored per trip.  A local the body
carries from one trip to the next (``s`` in ``s = s + x[k] * w[k]``) is not known in a
backward trip, and neither is anything computed from it; its adjoint is (it is passed
from trip to trip).  So a loop whose derivatives need a carried value, a nonlinear
recurrence such as ``s = s * x[k]`` or ``m = max(m, x[k])``, is refused with the
line; linear accumulations, and products by values that do not change between trips,
need no carried value and are derived.
"""

from __future__ import annotations

import io
import tokenize
from collections.abc import Mapping

from .ir import Assign, Block, For, If, Load, Store, blocks, statements, useful_values
from .ownership import Accumulator
from .program import Names, Program, typed_constant
from .rules import CONSTANTS, RULES, fill, reads
from .values import Refusal, grad_name

__all__ = ["write_body"]


def _defined_inside(block: Block) -> set[str]:
    found: set[str] = set()
    for _, stmt in statements(block):
        found.update(stmt.defines())
        if isinstance(stmt, For):
            found.add(stmt.target)
    return found


def _unavailable(block: Block, unavailable: set[str]) -> set[str]:
    """The values a replay of ``block`` cannot compute, given those it starts without."""
    out = set(unavailable)
    for stmt in block.stmts:
        if isinstance(stmt, (Assign, Load)):
            if stmt.reads() & out:
                out.update(stmt.defines())
        elif isinstance(stmt, If):
            if stmt.test in out:
                out |= _defined_inside(stmt.body) | _defined_inside(stmt.orelse) | set(stmt.defines())
                continue
            body, orelse = _unavailable(stmt.body, out), _unavailable(stmt.orelse, out)
            out |= body | orelse
            out.update(j.target for j in stmt.joins if j.body in body or j.orelse in orelse)
        elif isinstance(stmt, For):
            if (stmt.start.reads | stmt.stop.reads) & out:
                out |= _defined_inside(stmt.body) | set(stmt.defines())
                continue
            out |= _loop_unavailable(stmt, out)
    return out


def _loop_unavailable(loop: For, unavailable: set[str]) -> set[str]:
    """What a forward run of ``loop`` cannot compute: its carried values whose start or
    update needs an unavailable value (to a fixpoint), and what depends on them."""
    carriers = {c.carrier for c in loop.carried if c.init in unavailable}
    while True:
        body = _unavailable(loop.body, unavailable | carriers)
        more = {c.carrier for c in loop.carried if c.exit in body}
        if more <= carriers:
            return body | carriers
        carriers |= more


class _Writer:
    def __init__(self, program: Program, accumulators: Mapping[int, Accumulator], names: Names,
                 helpers: Mapping[str, str], refuse: Refusal, origin: Mapping[str, str]):
        self.program = program
        self.accumulators = accumulators
        self.names = names
        self.helpers = helpers
        self.refuse = refuse
        self.origin = origin
        self.lines: list[str] = []
        self.adjoints: dict[str, str] = {}
        self.homed: dict[int, list[Accumulator]] = {}
        for acc in {id(a): a for a in accumulators.values()}.values():
            self.homed.setdefault(id(acc.home), []).append(acc)
        self.types = dict(_all_floats(program.root))
        #: the float values whose adjoints the reverse pass keeps: those an output depends on
        self.active = set(self.types) & useful_values(program.root)
        self.loops: list[For] = []  # the loops whose reverse trips are being written
        #: writing a neighbour's copy (gather mode): the offsets ``((coordinate, d), ...)`` of
        #: the reads whose adjoints it gathers; its coordinates are this thread's minus them
        self.shift: tuple[tuple[str, int], ...] | None = None
        self.renamed: dict[str, str] | None = None  #: (a neighbour's copy) its names
        self.copy = ""  #: (a neighbour's copy) the suffix of its names; "" for this thread's code
        self.values = _defined_inside(program.root)  #: every SSA value
        #: the incoming gradients the replay loads early, by (copy, store ``id``): their names
        self.prefetched: dict[tuple[str, int], str] = {}
        self.early_assigns: set[int] = set()  #: (a neighbour's copy) root statements its early reads wrote
        self.deferred: dict[str, list[str]] = {}  #: the neighbours' reads, by gradient tensor
        self.in_loop = 0  #: writing a loop's body (its trips' gradients are loaded where they are used)
        self.half_outputs = {p.name for p in program.scope.spec.outputs if p.dtype.name in ("float16", "bfloat16")}

    # ------------------------------------------------------------------ helpers
    def out(self, text: str, indent: int) -> None:
        if self.renamed is not None:
            text = _rename(text, self.copy_name)
        self.lines.append("    " * indent + text)

    def copy_name(self, name: str) -> str:
        """A neighbour's copy's own name for ``name`` (each copy names its values afresh, so
        that every name has one definition: Numba prunes a constant branch in all of them)."""
        if name not in self.values and name not in self.adjoints.values():
            return name
        if name not in self.renamed:
            self.renamed[name] = self.names.fresh(f"{name}_{self.copy}")
        return self.renamed[name]

    def adj(self, name: str) -> str:
        if name not in self.adjoints:
            self.adjoints[name] = self.names.fresh(f"adj_{name}")
        return self.adjoints[name]

    def zero(self, ty: str) -> str:
        """An adjoint's start: -0.0, the exact identity of IEEE addition (x + -0.0 is x for
        every x; x + 0.0 is not, for x = -0.0), so NVVM drops the first ``+=`` of every
        adjoint without fast-math.  Stores add 0.0 (:meth:`flush`), so that a gradient
        nothing flowed into is 0.0, as PyTorch's."""
        return typed_constant(-0.0, ty, self.helpers)

    def user(self, name: str) -> str:
        return self.origin.get(name, name)

    def needs(self, names: set[str], unavailable: set[str], line: int, what: str) -> None:
        missing = sorted(names & unavailable)
        if not missing:
            return
        loop = self.loops[-1] if self.loops else None
        carried = ", ".join(sorted({repr(self.user(c.carrier)) for c in loop.carried})) if loop else ""
        raise self.refuse(line,
                          f"{what} needs {', '.join(repr(self.user(m)) for m in missing)} as it was in each trip of the "
                          f"loop at line {loop.line if loop else '?'}, which depends on {carried or 'a value'} carried "
                          f"from one trip to the next (a nonlinear recurrence such as s = s * x[k] or "
                          f"m = max(m, x[k])); pnex recomputes each trip's values but does not store carried ones. "
                          f"Carried values that only accumulate (s += ..., s = s * c with c fixed) are derived")

    # ------------------------------------------------------------------ the forward replay
    def forward(self, block: Block, indent: int, unavailable: set[str]) -> set[str]:
        """Write the replay of ``block``; returns what it could not compute."""
        unavailable = set(unavailable)
        early = self._early_reads(block)
        hoisted = {id(stmt) for stmts in early.values() for stmt in stmts if isinstance(stmt, Load)}
        for position, stmt in enumerate(block.stmts):
            for read in early.get(position, ()):
                if isinstance(read, Store):
                    self.prefetch(read, indent, unavailable)
                else:
                    self.load(read, indent, unavailable)
            if isinstance(stmt, Assign):
                if id(stmt) in self.early_assigns:
                    continue  # written before the copy, with its early reads
                if stmt.reads() & unavailable:
                    unavailable.update(stmt.defines())
                else:
                    self.assign(stmt, indent)
            elif isinstance(stmt, Load):
                if id(stmt) not in hoisted:
                    self.load(stmt, indent, unavailable)
            elif isinstance(stmt, If):
                unavailable = self.forward_if(stmt, indent, unavailable)
            elif isinstance(stmt, For):
                unavailable = self.forward_for(stmt, indent, unavailable)
        return unavailable

    def assign(self, stmt: Assign, indent: int) -> None:
        self.out(f"{', '.join(stmt.targets)} = {stmt.expr}", indent)
        for g, d in self.shift or ():
            if g in stmt.targets:  # the neighbour's coordinate; none: outside every region
                self.out(f"{g} = {g} - {d} if {g} >= {d} else 1 << 62" if d > 0 else f"{g} = {g} + {-d}", indent)

    def _read_back(self, store: Store) -> bool:
        """Whether the reverse pass reads ``store``'s incoming gradient (a gradient flows
        into the value it wrote)."""
        return store.differentiable and store.value.active and store.value.name in self.active

    def _grad_value(self, store: Store, index: list[str] | tuple[str, ...]) -> str:
        """The code of ``store``'s incoming gradient at ``index`` (float32 for a half output)."""
        value = f"{grad_name(store.tensor)}[{', '.join(index)}]"
        return f"{self.helpers['f32']}({value})" if store.tensor in self.half_outputs else value

    def _nested_stores(self, block: Block, top: bool = True):
        """The stores inside ``block``'s branches (not its own, not in loops) whose gradient
        the reverse pass reads."""
        for stmt in block.stmts:
            if isinstance(stmt, Store) and not top and self._read_back(stmt):
                yield stmt
            elif isinstance(stmt, If):
                yield from self._nested_stores(stmt.body, False)
                yield from self._nested_stores(stmt.orelse, False)

    def _index_slice(self, root: Block, store: Store) -> list[Assign] | None:
        """The statements of ``root`` (assignments only) that compute ``store``'s index, in
        order; None where the index needs a value computed anywhere else."""
        needed = set(store.index_reads) & self.values
        taken = []
        for stmt in reversed(root.stmts):
            made = set(stmt.defines()) & needed
            if not made:
                continue
            if not isinstance(stmt, Assign):
                return None
            taken.append(stmt)
            needed = (needed - made) | (set(stmt.reads()) & self.values)
        return None if needed else taken[::-1]

    def neighbour_reads(self, root: Block) -> None:
        """(A neighbour's copy) the statements that compute the indices of its incoming
        gradients, and a name for each gradient, zero until :meth:`write_neighbour_reads`
        reads them all, before every copy's code: then they are all in flight at once,
        where each copy would issue its own behind its region's tests, one after the other."""
        self.early_assigns = set()
        read: dict[tuple[str, ...], str] = {}  # the same element, stored in several branches: read once
        for store in self._nested_stores(root):
            taken = self._index_slice(root, store)
            if taken is None:
                continue
            for stmt in taken:
                if id(stmt) not in self.early_assigns:
                    self.early_assigns.add(id(stmt))
                    self.assign(stmt, 1)
            key = (store.tensor, *store.index)
            if key not in read:
                grad = grad_name(store.tensor)
                name = read[key] = self.names.fresh(f"{grad}_in")
                ty = "f32" if store.tensor in self.half_outputs else store.value.ty
                self.out(f"{name} = {typed_constant(0.0, ty, self.helpers)}", 1)
                # Each index clamped into the tensor by one unsigned minimum (a negative index
                # wraps around to a large one, clamped to the last element); the value is used
                # only where the copy's tests pass, where the index was in bounds.
                u64 = self.helpers["u64"]
                index = [f"min({u64}({e}), {u64}({grad}.shape[{axis}] - 1))" for axis, e in enumerate(store.index)]
                line = f"{name} = {self._grad_value(store, index)}"
                self.deferred.setdefault(grad, []).append(line if self.renamed is None else _rename(line, self.copy_name))
            self.prefetched[(self.copy, id(store))] = read[key]

    def write_neighbour_reads(self) -> None:
        """The reads :meth:`neighbour_reads` named, together (none from an empty tensor,
        which no store of the forward's can have written)."""
        for grad, lines in self.deferred.items():
            self.out(f"if {grad}.size > 0:", 1)
            for line in lines:
                self.out(line, 2)

    def _early_reads(self, block: Block) -> dict[int, list[Load | Store]]:
        """What ``block`` reads from memory (its own loads, and the incoming gradient of
        each store it makes), outside loops and in this thread's replay, by the position
        the replay reads it before: as soon as its index is known.  A thread then keeps
        all its reads in flight at once, as a hand-written backward loads its inputs
        first, where the reverse pass would issue the gradients' only after the replayed
        math, and a branch's loads after the branch.  Each is read on the paths that read
        it anyway (the same block; the replay writes nothing), so never out of bounds."""
        if self.shift is not None or self.in_loop:
            return {}
        inside = _defined_inside(block)
        early: dict[int, list[Load | Store]] = {}
        for position, stmt in enumerate(block.stmts):
            if isinstance(stmt, Store):
                if not self._read_back(stmt) or (self.copy, id(stmt)) in self.prefetched:
                    continue
            elif not isinstance(stmt, Load):
                continue
            needed = set(stmt.index_reads) & inside
            at = 0
            while needed and at < position:
                needed -= set(block.stmts[at].defines())
                at += 1
            if isinstance(stmt, Store) or at < position:
                early.setdefault(at, []).append(stmt)
        return early

    def load(self, stmt: Load, indent: int, unavailable: set[str]) -> None:
        """Write ``stmt``'s read (``unavailable`` gets its value where its index is not known)."""
        if stmt.index_reads & unavailable:
            unavailable.add(stmt.target)
            return
        value = f"{stmt.tensor}[{', '.join(stmt.index)}]"
        self.out(f"{stmt.target} = {self.helpers['f32']}({value})" if stmt.half else f"{stmt.target} = {value}",
                 indent)

    def prefetch(self, store: Store, indent: int, unavailable: set[str]) -> None:
        """Read ``store``'s incoming gradient into a name of its own."""
        if set(store.index_reads) & unavailable:
            return
        name = self.names.fresh(f"{grad_name(store.tensor)}_in")
        self.out(f"{name} = {self._grad_value(store, store.index)}", indent)
        self.prefetched[(self.copy, id(store))] = name

    def pass_if_empty(self, start: int, indent: int) -> None:
        if len(self.lines) == start:
            self.out("pass", indent)

    def forward_if(self, stmt: If, indent: int, unavailable: set[str]) -> set[str]:
        if stmt.test in unavailable:
            return unavailable | _defined_inside(stmt.body) | _defined_inside(stmt.orelse) | set(stmt.defines())
        self.out(f"if {stmt.test}:", indent)
        start = len(self.lines)
        body = self.forward(stmt.body, indent + 1, unavailable)
        for j in stmt.joins:
            if j.body not in body:
                self.out(f"{j.target} = {j.body}", indent + 1)
        self.pass_if_empty(start, indent + 1)
        mark = len(self.lines)
        self.out("else:", indent)
        orelse = self.forward(stmt.orelse, indent + 1, unavailable)
        for j in stmt.joins:
            if j.orelse not in orelse:
                self.out(f"{j.target} = {j.orelse}", indent + 1)
        if len(self.lines) == mark + 1:
            del self.lines[mark:]
        return body | orelse | {j.target for j in stmt.joins if j.body in body or j.orelse in orelse}

    def forward_for(self, loop: For, indent: int, unavailable: set[str]) -> set[str]:
        if (loop.start.reads | loop.stop.reads) & unavailable:
            return unavailable | _defined_inside(loop.body) | set(loop.defines())
        gone = _loop_unavailable(loop, unavailable) - unavailable
        carriers = [c for c in loop.carried if c.carrier not in gone]
        for c in carriers:
            self.out(f"{c.carrier} = {c.init}", indent)
        self.out(f"for {loop.target} in {self.range_text(loop)}:", indent)
        start = len(self.lines)
        self.in_loop += 1
        try:
            self.forward(loop.body, indent + 1, unavailable | {c.carrier for c in loop.carried if c.carrier in gone})
        finally:
            self.in_loop -= 1
        for c in carriers:
            if c.exit != c.carrier:
                self.out(f"{c.carrier} = {c.exit}", indent + 1)
        self.pass_if_empty(start, indent + 1)
        return unavailable | gone

    @staticmethod
    def range_text(loop: For) -> str:
        if loop.step == 1:
            return f"range({loop.stop.text})" if loop.start.text == "0" else \
                f"range({loop.start.text}, {loop.stop.text})"
        return f"range({loop.start.text}, {loop.stop.text}, {loop.step})"

    # ------------------------------------------------------------------ the reverse pass
    def reverse(self, block: Block, indent: int, unavailable: set[str], transfers: list[str] = ()) -> None:
        start = len(self.lines)
        for name, ty in block.floats:
            if name in self.active:
                self.out(f"{self.adj(name)} = {self.zero(ty)}", indent)
        for acc in self.homed.get(id(block), ()) if self.shift is None else ():
            self.out(f"{acc.name} = {self.zero(acc.ty)}", indent)
        for line in transfers:
            self.out(line, indent)
        for stmt in reversed(block.stmts):
            if isinstance(stmt, Assign):
                self.reverse_assign(stmt, indent, unavailable)
            elif isinstance(stmt, Load):
                self.reverse_load(stmt, indent)
            elif isinstance(stmt, Store):
                self.reverse_store(stmt, indent, unavailable)
            elif isinstance(stmt, If):
                self.reverse_if(stmt, indent, unavailable)
            elif isinstance(stmt, For):
                self.reverse_for(stmt, indent, unavailable)
        for acc in self.homed.get(id(block), ()) if self.shift is None else ():
            self.flush(acc, indent, unavailable)
        self.pass_if_empty(start, indent)

    def reverse_load(self, stmt: Load, indent: int) -> None:
        if stmt.target not in self.active:
            return  # no output depends on the value read: nothing to add
        acc = self.accumulators[id(stmt)]
        if acc.mode == "gather":
            offset = acc.offsets[id(stmt)]
            if self.shift is None and not offset:  # this thread's own element
                self.out(f"{acc.name} += {self.adj(stmt.target)}", indent)
            elif self.shift is not None and offset == self.shift:  # a neighbour's read of this thread's element
                self.out(f"{acc.gathered} += {self.adj(stmt.target)}", indent)
        elif self.shift is None:
            self.out(f"{acc.name} += {self.adj(stmt.target)}", indent)

    def reverse_assign(self, stmt: Assign, indent: int, unavailable: set[str]) -> None:
        if stmt.rule is None or stmt.targets[0] not in self.active:
            return  # no gradient, or no output depends on the value: its terms would be 0 * (maybe inf)
        rule = RULES[stmt.rule]
        target = stmt.targets[0]
        values = {"a": stmt.args[0].text, "r": target, "g": self.adj(target), "math": self.helpers["math"],
                  **{k: typed_constant(v, stmt.ty, self.helpers) for k, v in CONSTANTS.items()}, **stmt.extra}
        if len(stmt.args) > 1:
            values["b"] = stmt.args[1].text
        named = {"a": stmt.args[0].name, "b": stmt.args[1].name if len(stmt.args) > 1 else None, "r": target}
        for arg, partial in zip(stmt.args, rule.partials):
            if partial is None or not arg.active or arg.name not in self.active:
                continue
            needed = {named[v] for v in reads(partial) if named[v] is not None}
            self.needs(needed, unavailable, stmt.line, f"the derivative of {stmt.rule}")
            code = fill(partial, values)
            if stmt.ty == "f64" and self.types.get(arg.name) == "f32":
                code = f"{self.helpers['f32']}({code})"  # the adjoint stays float32
            self.out(f"{self.adj(arg.name)} += {code}", indent)

    def reverse_store(self, stmt: Store, indent: int, unavailable: set[str]) -> None:
        if not self._read_back(stmt):
            return
        self.needs(set(stmt.index_reads), unavailable, stmt.line, f"the write of {stmt.tensor!r}")
        grad = self.prefetched.get((self.copy, id(stmt))) or self._grad_value(stmt, stmt.index)
        self.out(f"{self.adj(stmt.value.name)} {'-=' if stmt.op == '-' else '+='} {grad}", indent)

    def reverse_if(self, stmt: If, indent: int, unavailable: set[str]) -> None:
        start = len(self.lines)
        self.out(f"if {stmt.test}:", indent)
        body_start = len(self.lines)
        self.reverse(stmt.body, indent + 1, unavailable,
                     [f"{self.adj(j.body)} += {self.adj(j.target)}" for j in stmt.joins
                      if j.active and j.target in self.active and j.body in self.active])
        body_empty = self.lines[body_start:] == ["    " * (indent + 1) + "pass"]
        else_start = len(self.lines)
        self.out("else:", indent)
        self.reverse(stmt.orelse, indent + 1, unavailable,
                     [f"{self.adj(j.orelse)} += {self.adj(j.target)}" for j in stmt.joins
                      if j.active and j.target in self.active and j.orelse in self.active])
        else_empty = self.lines[else_start + 1:] == ["    " * (indent + 1) + "pass"]
        if body_empty and else_empty:
            del self.lines[start:]
            return
        if else_empty:
            del self.lines[else_start:]
        self.needs({stmt.test}, unavailable, stmt.line, "the branch taken")

    def reverse_for(self, loop: For, indent: int, unavailable: set[str]) -> None:
        start = len(self.lines)
        self.loops.append(loop)
        try:
            self.reverse_range(loop, indent)
            carriers = {c.carrier for c in loop.carried}
            self.in_loop += 1
            try:
                replay = self.forward(loop.body, indent + 1, unavailable | carriers)  # this trip's values
            finally:
                self.in_loop -= 1
            transfers = []
            for c in loop.carried:
                if c.active and c.exit != c.carrier and c.carrier in self.active and c.exit in self.active:
                    transfers += [f"{self.adj(c.exit)} += {self.adj(c.carrier)}",
                                  f"{self.adj(c.carrier)} = {self.zero(c.ty)}"]
            work = len(self.lines)
            self.reverse(loop.body, indent + 1, replay, transfers)
            if self.lines[work:] == ["    " * (indent + 1) + "pass"]:
                del self.lines[start:]
                return
            self.needs(set(loop.start.reads | loop.stop.reads), unavailable, loop.line, "the loop's bounds")
        finally:
            self.loops.pop()
        for c in loop.carried:
            if c.active and c.carrier in self.active and c.init in self.active:
                self.out(f"{self.adj(c.init)} += {self.adj(c.carrier)}", indent)

    def reverse_range(self, loop: For, indent: int) -> None:
        start, stop, step = loop.start.text, loop.stop.text, loop.step
        if step == 1:
            self.out(f"for {loop.target} in range({stop} - 1, {start} - 1, -1):", indent)
            return
        trips = self.names.fresh("trips")
        r = self.names.fresh("r")
        if step > 0:
            self.out(f"{trips} = max(0, ({stop} - {start} + {step - 1}) // {step})", indent)
        else:
            self.out(f"{trips} = max(0, ({start} - {stop} + {-step - 1}) // {-step})", indent)
        self.out(f"for {r} in range({trips}):", indent)
        self.out(f"{loop.target} = {start} + ({trips} - 1 - {r}) * {step}", indent + 1)

    def flush(self, acc: Accumulator, indent: int, unavailable: set[str]) -> None:
        self.needs(set(acc.index_reads), unavailable, 0, f"the gradient of {acc.tensor!r}")
        grad = grad_name(acc.tensor)
        index = ", ".join(acc.index)
        if acc.mode == "atomic":
            where = index if len(acc.index) == 1 else f"({index})"
            self.out(f"{self.helpers['cuda']}.atomic.add({grad}, {where}, {acc.name})", indent)
            return
        # A store or gather element's index is proven in the tensor (ownership.py): unsigned,
        # it needs none of Numba's code for negative indices (a dozen instructions a store).
        index = ", ".join(f"{self.helpers['u64']}({e})" for e in acc.index)
        zero = typed_constant(0.0, acc.ty, self.helpers)  # -0.0 (no contribution) stored as 0.0
        if acc.mode == "gather":
            self.out(f"{grad}[{index}] = {acc.name} + {acc.gathered} + {zero}", indent)
            return
        self.out(f"{grad}[{index}] = {acc.name} + {zero}", indent)
        for f in acc.fills:
            size = f"{acc.tensor}.shape[{f.axis}]"
            if f.step is None:
                at = list(f.index)
                at[f.axis] = f.start
                self.out(f"if {f.start} < {size}:", indent)
                self.out(f"{grad}[{', '.join(at)}] = 0.0", indent + 1)
                continue
            j = self.names.fresh("j")  # a while loop: range() would divide by the step in every thread
            at = list(f.index)
            at[f.axis] = j
            self.out(f"{j} = {f.start}", indent)
            self.out(f"while {j} < {size}:", indent)
            self.out(f"{grad}[{', '.join(at)}] = 0.0", indent + 1)
            self.out(f"{j} += {f.step}", indent + 1)


def _rename(text: str, rename) -> str:
    """``text`` (one line of code) with each name ``rename`` maps replaced (not attributes)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text + "\n").readline))
    out, last = [], 0
    for k, tok in enumerate(tokens):
        if tok.type != tokenize.NAME or (k and tokens[k - 1].string == "."):
            continue
        new = rename(tok.string)
        if new != tok.string:
            out += [text[last:tok.start[1]], new]
            last = tok.end[1]
    return "".join(out) + text[last:]


def write_body(program: Program, accumulators: Mapping[int, Accumulator], names: Names,
               helpers: Mapping[str, str], refuse: Refusal, origin: Mapping[str, str]) -> list[str]:
    """The backward kernel's body: the forward replay, then the reverse pass."""
    writer = _Writer(program, accumulators, names, helpers, refuse, origin)
    gathers = list({id(a): a for a in accumulators.values() if a.mode == "gather"}.values())
    for acc in gathers:
        writer.out(f"{acc.gathered} = {writer.zero(acc.ty)}  # what other threads' reads add to grad_{acc.tensor}", 1)
    shifts = sorted({o for acc in gathers for o in acc.offsets.values() if o})
    copies = []
    if shifts:
        writer.out("# the incoming gradients this thread and its neighbours' copies use, read first "
                   "(each used only where its copy's tests pass)", 1)
    for k, shift in enumerate(shifts):
        writer.shift, writer.renamed, writer.copy = shift, {}, f"n{k + 1}"
        writer.neighbour_reads(program.root)
        copies.append((shift, writer.renamed, writer.copy, writer.early_assigns))
    writer.shift, writer.renamed, writer.copy = None, None, ""
    own = set()
    if shifts:  # this thread's own incoming gradients, in the same group
        writer.neighbour_reads(program.root)
        own = writer.early_assigns
    writer.write_neighbour_reads()
    for shift, renamed, copy, early in copies:
        place = ", ".join(f"{g} {'+' if -d > 0 else '-'} {abs(d)}" for g, d in shift)
        writer.out(f"# as the thread at {place}: its adjoints of the elements this thread's coordinates name", 1)
        writer.shift, writer.renamed, writer.copy, writer.early_assigns = shift, renamed, copy, early
        writer.reverse(program.root, 1, writer.forward(program.root, 1, set()))
    writer.shift, writer.renamed, writer.copy, writer.early_assigns = None, None, "", own
    writer.out("# the forward pass, replayed: every value the derivatives need (nothing is written)", 1)
    unavailable = writer.forward(program.root, 1, set())
    writer.out("# the reverse pass: each statement's adjoint, last statement first", 1)
    writer.reverse(program.root, 1, unavailable)
    return writer.lines


def _all_floats(block: Block):
    for inner in blocks(block):
        yield from inner.floats

