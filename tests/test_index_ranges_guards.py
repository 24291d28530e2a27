"""Accesses to tensor parameters the checked variant proves in bounds under the kernel's own
guards (:mod:`pnex_magic.checking.index_ranges`), without a GPU: ``if i < a.shape[0]``, an early
exit, a flag, loops, offsets, each line of the kernels below marked "# proven" or "# checked";
and a randomised check: for 500 generated guarded kernels, whatever a guard proves is in bounds
for every thread, block and size.

The stencil, index expressions and the simulator: tests/test_index_ranges.py.
"""

from __future__ import annotations

import itertools
import random
import re
import types

import pytest
from numba import cuda

import pnex_magic as pnex
from pnex_magic import checking as C


# ------------------------------------------------------------------ tensor parameters under guards
# Each kernel marks every access of a tensor parameter with a comment: "# proven" where
# the guards and the op's shape declarations prove it in bounds, "# checked" where
# they do not.

F1 = pnex.In("f32", (None,))
F2 = pnex.In("f32", (None, None))


def guarded(a: F1, b: pnex.In("f32", "a"), free: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] + b[i]  # proven
        out[i] = free[i]  # proven (out), checked (free: its own size)
    if i <= a.shape[0]:
        out[i] = 0.0  # checked: off by one
    if i < a.shape[0] or i < 4:
        out[i] = 0.0  # checked
    if i < len(a):
        j = i
        out[j] = 1.0  # checked: j is not guarded
        out[i] = 2.0  # proven
    n = a.shape[0]
    if i < n:
        out[i] = a[i]  # proven


def rebound(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        i = i + 1
        out[i] = a[0]  # checked (and a[0] too: a may be empty)


def early_exit(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i >= a.shape[0]:
        return
    out[i] = a[i]  # proven
    j = cuda.grid(1) - 1
    if j >= a.shape[0] or j < 0:
        return
    out[j] = a[j]  # proven
    m = cuda.grid(1) + 1
    if a.shape[0] < m:
        return
    out[m] = a[m]  # checked: m may be a.shape[0]
    if a.shape[0] <= m:
        return
    out[m] = 1.0  # proven


def flags(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    ok = 0 <= i - 1 < a.shape[0]
    k = i - 1
    if ok:
        out[i] = a[i]  # checked: the flag speaks of i - 1, not i
    near = i < a.shape[0]
    if near and ok:
        out[i] = a[i]  # proven
    j = i
    late = j < a.shape[0]
    j = j + 0
    if late:
        out[j] = 1.0  # checked: j rebound after the flag
    for t in range(2):
        inner = i < a.shape[0]
        if inner:
            out[i] = 2.0  # checked: a flag assigned in a loop
    early = k < a.shape[0]
    if early:
        out[k] = 3.0  # checked: k may be -1


def no_exit(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i >= a.shape[0]:
        out[0] = 1.0  # checked
    out[i] = a[i]  # checked: the if does not leave


def early_exit_with_else(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i >= a.shape[0]:
        return
    else:
        out[0] = 1.0  # checked
    out[i] = a[i]  # checked: an else branch, no early exit recognised


def lower_bounds(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    j = i - 1
    if j < a.shape[0]:
        out[j] = 0.0  # checked: j may be -1
    if 0 <= j < a.shape[0]:
        out[j] = a[j]  # proven
    k = cuda.threadIdx.x - 2
    if k >= 0 and k < a.shape[0]:
        out[k] = 1.0  # proven


def shapes(points: pnex.In("f32", (None, 2)), m: F2, n: pnex.Scalar("i64"), other: pnex.Scalar("i64"),
           sized: pnex.Out("f32", ("n",)), rows: pnex.Out("f32", ("m.size(1)",))):
    i, j = cuda.grid(2)
    if i < points.shape[0]:
        sized[0] = points[i, 1]  # proven (points) / checked (sized: n may be 0)
        sized[0] = points[i, 2]  # checked: axis 1 has 2 entries
    if i < n:
        sized[i] = 1.0  # proven
    if i < other:
        sized[i] = 2.0  # checked
    if i < m.shape[0] and j < m.shape[1]:
        rows[j] = m[i, j]  # proven
        rows[i] = m[j, i]  # checked
    r, c = m.shape
    if j < c:
        rows[j] = 3.0  # proven


def loops(c: F2, a: F1, out: pnex.Out("f32", "a")):
    for k in range(c.shape[0]):
        out[0] = c[k, 0]  # checked: a may be empty, c may have no columns
    for k in range(c.shape[0]):
        out[0] = c[k, c.shape[1] - 1]  # checked (c has at least one row here, maybe no column)
    for k in range(c.shape[0] + 1):
        a[k]  # checked
    for k in range(len(a)):
        k = k + 1
        out[k] = 0.0  # checked: rebound
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        out[i] = a[i]  # proven
    for t in range(cuda.threadIdx.x - 1, a.shape[0]):
        out[t] = a[t]  # checked: t starts at -1 in thread 0
    for d in range(a.shape[0] + 3, a.shape[0], -1):
        out[d] = 0.0  # checked: counts down from past the end
    base = cuda.grid(1) * 4
    for j in range(4):
        i = base + j
        if i >= a.shape[0]:
            continue
        out[i] = a[i]  # proven


def offsets(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    n = a.shape[0]
    if 0 < i < n - 1:
        v = a[i - 1]  # proven
        v = a[i + 1]  # proven
        v = a[i + 2]  # checked: i + 2 may be n
        v = a[i - 2]  # checked: i - 2 may be -1
        out[i] = v  # proven
    if i + 2 <= n:
        v = a[1 + i]  # proven
    if 2 <= i and i < n:
        v = a[i - 2]  # proven
    if i < n + 1:
        v = a[i - 1]  # checked: i - 1 may be -1 (and i < n + 1 is not i < n)


def expressions(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    out[0] = a[i] if i < a.shape[0] else a[i]  # checked (out[0], the second a[i]), proven (the first)


def walrus(a: F1, out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0] and (i := i + 1) > 0:
        out[i] = 1.0  # checked: i rebound in the test


def _verdicts(fn, n_threads):
    from pnex_magic.spec import build_spec

    ck = C.checked_kernel(fn, build_spec(fn, n_threads=n_threads))
    return ck


def _marked(fn):
    """(line, expected) for each line of ``fn`` marked "# proven" or "# checked"."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return {first + k: line.split("#")[1].strip() for k, line in enumerate(lines) if "# proven" in line or "# checked" in line}


@pytest.mark.parametrize("fn, n_threads", [
    (guarded, "a.numel()"), (early_exit, "a.numel()"), (early_exit_with_else, "a.numel()"),
    (lower_bounds, "a.numel()"), (shapes, ("m.size(0)", "m.size(1)")), (loops, "a.numel()"),
    (expressions, "a.numel()"), (rebound, "a.numel()"), (walrus, "a.numel()"), (no_exit, "a.numel()"),
    (flags, "a.numel()"), (offsets, "a.numel()"),
])
def test_tensor_accesses_proven_under_guards(fn, n_threads):
    ck = _verdicts(fn, n_threads)
    tensors = {"parameter"}
    proven = {(s.line, s.variable) for s in ck.proven if s.role in tensors}
    checked = {(s.line, s.variable) for s in ck.sites if s.role in tensors}
    for line, note in _marked(fn).items():
        here_proven = {v for ln, v in proven if ln == line}
        here_checked = {v for ln, v in checked if ln == line}
        text = linecache_line(fn, line)
        if "proven" not in note:
            assert here_checked and not here_proven, (line, text, here_proven, here_checked)
        elif "checked" not in note:
            assert here_proven and not here_checked, (line, text, here_proven, here_checked)
        else:  # a mixed line: both kinds present
            assert here_proven and here_checked, (line, text, here_proven, here_checked)


def linecache_line(fn, line):
    import linecache

    return linecache.getline(fn.__code__.co_filename, line).strip()


# ------------------------------------------------------------------ randomised soundness of guards

_INITS = ("cuda.grid(1)", "cuda.grid(1) - 1", "cuda.threadIdx.x + 2", "cuda.grid(1) * 2", "cuda.blockIdx.x")
_STEPS = ("", "i = i + 1", "j = i", "i = cuda.grid(1)")
_CONDS = ("i < a.shape[0]", "i <= a.shape[0]", "0 <= i < a.shape[0]", "i < a.shape[0] and i >= 0",
          "i < a.shape[0] or i < 2", "i < free.shape[0]", "i < len(a)", "i < n", "a.shape[0] > i",
          "a.shape[0] >= i", "0 < i < a.shape[0]", "not (i >= a.shape[0])", "not (a.shape[0] < i)",
          # offsets: i + k < size and i >= c
          "0 < i < a.shape[0] - 1", "i < a.shape[0] - 2", "1 <= i < n", "i + 1 < a.shape[0]", "i - 1 < a.shape[0]",
          "2 < i + 1 and i < a.shape[0]", "i <= a.shape[0] - 1", "i + 2 <= a.shape[0]", "-1 < i - 1 < n + 1")
_EXITS = ("i >= a.shape[0]", "i > a.shape[0]", "i >= a.shape[0] or i < 0", "not (i < a.shape[0])",
          "i >= free.shape[0]", "a.shape[0] <= i", "a.shape[0] < i", "i + 1 > a.shape[0]", "0 > i or i >= n",
          "a.shape[0] <= i or 0 > i", "not (0 <= i < a.shape[0])", "i > a.shape[0] or i >= a.shape[0]",
          "i >= a.shape[0] - 1 or i < 1", "i + 2 > a.shape[0]", "i < 2 or i >= n")
#: the index of the guarded read of ``a`` (an offset from ``i`` as a stencil reads)
_READS = ("i", "i", "i", "i + 1", "i - 1", "i + 2", "i - 2", "1 + i")


def _random_kernel(rng, name):
    read = f"out[i] = a[{rng.choice(_READS)}]"
    lines = [f"def {name}(a: pnex.In('f32', (None,)), free: pnex.In('f32', (None,)), n: pnex.Scalar('i64'),",
             "        out: pnex.Out('f32', ('n',))):",
             f"    i = {rng.choice(_INITS)}"]
    step = rng.choice(_STEPS)
    if step:
        lines.append(f"    {step}")
    form = rng.randrange(5)
    inner = rng.choice(("", "i = i - 1", "j = i"))
    if form == 0:
        lines += [f"    if {rng.choice(_CONDS)}:"]
        if rng.random() < 0.25:  # the access in the else branch: the test is false there
            lines += ["        pass", "    else:"]
        lines += [f"        {inner}"] * bool(inner) + [f"        {read}"]
    elif form == 1:
        if rng.random() < 0.3:  # leave a loop's trip instead of the kernel
            lines += ["    for t in range(2):", f"        if {rng.choice(_EXITS)}:",
                      f"            {rng.choice(('continue', 'break', 'pass'))}"]
            lines += [f"        {inner}"] * bool(inner) + [f"        {read}"]
        else:
            lines += [f"    if {rng.choice(_EXITS)}:", f"        {rng.choice(('return', 'return', 'pass'))}"]
            lines += [f"    {inner}"] * bool(inner) + [f"    {read}"]
    elif form == 2:
        lines += [f"    out[0] = a[{rng.choice(_READS)}] if {rng.choice(_CONDS)} else 0.0"]
    elif form == 3:
        # a flag: assigned once, then tested (maybe after i changes, maybe inside a loop)
        lines += [f"    ok = {rng.choice(_CONDS)}"]
        later = rng.choice(("", "i = i + 1", "i = 0", "j = i"))
        lines += [f"    {later}"] * bool(later)
        if rng.random() < 0.3:
            lines += ["    for t in range(2):", "        if ok:", f"            {read}"]
        else:
            lines += ["    if ok and n > 0:", f"        {read}"]
    else:
        start = rng.choice(("", "", "cuda.threadIdx.x - 1, ", "cuda.grid(1), "))
        lines += [f"    for i in range({start}{rng.choice(('a.shape[0]', 'n', 'a.shape[0] + 1', 'free.shape[0]'))}):"]
        lines += [f"        {inner}"] * bool(inner) + [f"        {read}"]
    return "\n".join(lines) + "\n"


class _Checked1D:
    """A 1-D array that records each access out of ``[0, len)`` with its line."""

    def __init__(self, size, name, bad):
        self.shape, self.name, self.bad = (size,), name, bad

    def __len__(self):
        return self.shape[0]

    def _check(self, i):
        import sys

        if not 0 <= i < self.shape[0]:
            self.bad.add((sys._getframe(2).f_lineno, self.name))

    def __getitem__(self, i):
        self._check(i)
        return 0.0

    def __setitem__(self, i, value):
        self._check(i)


def test_whatever_a_guard_proves_is_in_bounds_for_every_thread(tmp_path, monkeypatch):
    import importlib.util

    from pnex_magic.spec import build_spec

    rng = random.Random(11242026)
    names = [f"k{n}" for n in range(500)]
    path = tmp_path / "random_guards.py"
    path.write_text("from numba import cuda\nimport pnex_magic as pnex\n\n\n" +
                    "\n\n".join(_random_kernel(rng, name) for name in names))
    module_spec = importlib.util.spec_from_file_location("random_guards", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    proven_total = proven_offsets = 0
    lines = path.read_text().splitlines()
    for name in names:
        fn = getattr(module, name)
        ck = C.checked_kernel(fn, build_spec(fn, n_threads="a.numel()", threads_per_block=4))
        proven = {(s.line, s.variable) for s in ck.proven}
        proven_total += len(proven)
        proven_offsets += sum(v == "a" and re.search(r"a\[(i [+-] \d|\d \+ i)\]", lines[line - 1]) is not None
                              for line, v in proven)
        for a_len, free_len, n in itertools.product((0, 1, 5), (0, 3, 9), (0, 2, 7)):
            bad: set = set()
            # out has n entries, as the op makes it (Out("f32", ("n",)))
            arrays = _Checked1D(a_len, "a", bad), _Checked1D(free_len, "free", bad), n, _Checked1D(n, "out", bad)
            for block, thread in itertools.product(range(3), range(4)):
                fake = types.SimpleNamespace(
                    threadIdx=types.SimpleNamespace(x=thread), blockIdx=types.SimpleNamespace(x=block),
                    blockDim=types.SimpleNamespace(x=4), grid=lambda _: block * 4 + thread,
                    gridsize=lambda _: 12)
                monkeypatch.setattr(module, "cuda", fake)
                fn(*arrays)
                monkeypatch.setattr(module, "cuda", cuda)
            wrong = bad & proven
            assert not wrong, (name, (a_len, free_len, n), wrong, "\n" + _source_of(path, fn))
    # a fair share of the 1,000 accesses is proven (135 when written, 86 with the offset reads), offset reads too
    assert proven_total >= 80 and proven_offsets >= 10, (proven_total, proven_offsets)


def _source_of(path, fn):
    import inspect

    return "".join(inspect.getsourcelines(fn)[0])
