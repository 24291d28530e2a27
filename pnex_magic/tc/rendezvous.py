"""The warp rendezvous of the CPU simulator: how the lanes of a warp (or a warpgroup)
meet at a warp-level operation.

numba-cuda's simulator runs each CUDA thread as a Python thread.  A warp-level
instruction needs every lane's operands at once: each lane hands its own to its
warp's rendezvous (:func:`collective`); the last lane to arrive computes every lane's
result from the whole warp's operands, and each lane takes its own.  Lanes that meet
at different operations fail together with one error (on the GPU the warp would hang or
compute garbage); lanes that wait for a lane that never comes (it has ended, or waits
elsewhere) are part of the launch's deadlock report (:mod:`pnex_magic.launch.waits`),
or, in a launch without one, fail once a lane they wait for has ended.

Cost: a simulated FlashAttention launch meets here tens of thousands of times, so a
thread keeps its place (block, warp, lane) and its warp's rendezvous once found, and a
waiting lane sleeps on a gate of its own that the completing lane opens (a lane woken
from a shared condition would first have to take the warp's lock again).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["collective", "checked_collective", "lane_id", "thread_position", "track_thread_ends"]

_WAIT_S = 0.05  # how often a waiting lane looks whether the launch was aborted


class _Warp:
    """The rendezvous of one warp's lanes.  A lane that waits sleeps on a gate of its own
    (a lock it holds).  The lane that completes the warp opens the first waiting lane's
    gate, and each lane woken opens the next one's: one lane at a time wants the GIL
    (all woken at once, 31 threads would wake only to queue for it), and none needs the
    warp's lock again, as a lane woken from a condition would."""

    def __init__(self, lanes: int):
        self.lanes = lanes
        self.slots: list[Any] = [None] * lanes
        self.names: list[str | None] = [None] * lanes
        self.arrived = 0
        self.generation = 0
        self.results: Sequence[Any] = ()
        self.lock = threading.Lock()
        self.gates: list[Any] = []  # the gates of the lanes waiting, in the order they came

    def open_gates(self) -> None:
        """Start the next generation and wake the waiting lanes, the first one here (the
        lock held)."""
        self.slots, self.names, self.arrived = [None] * self.lanes, [None] * self.lanes, 0
        self.generation += 1
        if self.gates:
            self.gates[0].release()
        self.gates = []


_WARPS: "weakref.WeakKeyDictionary[Any, dict[tuple, _Warp]]" = weakref.WeakKeyDictionary()
_WARPS_LOCK = threading.Lock()


def thread_position(group: int = 32) -> tuple[Any, tuple, int, int, int]:
    """(the block's manager, the block index, the warp, the lane, the warp's lanes) of
    the calling simulated thread; with ``group=128``, its warpgroup, its place in it and
    the warpgroup's threads.  Worked out once per thread and group (a thread keeps its
    block and its place in it)."""
    thread = threading.current_thread()
    known = getattr(thread, "_pnex_positions", None)
    if known is not None and group in known:
        return known[group][0]
    manager = getattr(thread, "_manager", None)
    if manager is None or not hasattr(thread, "thread_id"):
        raise RuntimeError("a warp-level primitive was called outside a simulated CUDA kernel")
    block_dim = manager._block_dim
    threads = int(np.prod(block_dim))
    warp, lane = divmod(thread.thread_id, group)
    lanes = min(group, threads - group * warp)
    position = manager, tuple(thread.blockIdx), warp, lane, lanes
    if known is None:
        known = thread._pnex_positions = {}
    known[group] = position, _warp(manager, position[1], warp, lanes, group)
    return position


def _my_warp(group: int) -> tuple[tuple[Any, tuple, int, int, int], "_Warp"]:
    """(:func:`thread_position`, the rendezvous of its warp or warpgroup)."""
    known = getattr(threading.current_thread(), "_pnex_positions", None)
    if known is None or group not in known:
        thread_position(group)
        known = threading.current_thread()._pnex_positions
    return known[group]


def _warp(manager: Any, block: tuple, warp: int, lanes: int, group: int) -> _Warp:
    with _WARPS_LOCK:
        per_manager = _WARPS.get(manager)
        if per_manager is None:
            per_manager = _WARPS[manager] = {}
        found = per_manager.get((block, group, warp))
        if found is None:
            found = per_manager[(block, group, warp)] = _Warp(lanes)
        return found


def lane_id() -> int:
    return thread_position()[3]


def collective(name: str, value: Any, combine: Callable[[list[Any]], Sequence[Any]], group: int = 32) -> Any:
    """This lane's share of a warp-wide operation: every lane of the warp calls it with
    its own ``value``; ``combine`` (run once, by the last lane to arrive) maps the list
    of all lanes' values, in lane order, to the list of their results.  ``group=128``:
    a warpgroup-wide operation (Hopper's ``wgmma``), over 4 consecutive warps."""
    (manager, block, warp_index, lane, lanes), warp = _my_warp(group)
    with warp.lock:
        generation = warp.generation
        warp.slots[lane] = value
        warp.names[lane] = name
        warp.arrived += 1
        if warp.arrived == warp.lanes:
            names = set(warp.names)
            slots = warp.slots
            try:
                if len(names) > 1:
                    raise RuntimeError(
                        f"the lanes of {'warp' if group == 32 else 'warpgroup'} {warp_index} (block {block}) met at "
                        f"different {'warp' if group == 32 else 'warpgroup'}-level operations "
                        f"({', '.join(sorted(n for n in names if n))}): every lane of a warp must execute the same "
                        f"one (a warp-level instruction inside a branch that some lanes skip)"
                    )
                results = combine(slots)
            except BaseException as exc:
                results = _Failed(exc)  # every lane raises it
            warp.results = results
            warp.open_gates()
            gate = None
        else:
            gate, chain = _gate(), warp.gates
            chain.append(gate)
            place = len(chain)
    if gate is not None:
        _wait(gate, warp, generation, manager, block, warp_index, group, name)
        if place < len(chain):  # (complete: no lane joins a chain once its gates open)
            chain[place].release()  # the next lane's turn
        results = warp.results  # this generation's: the next cannot complete before this lane arrives
    if isinstance(results, _Failed):
        raise results.exc
    return results[lane]


def _gate() -> Any:
    """The calling thread's gate: a lock it holds (taken again each time it is opened)."""
    thread = threading.current_thread()
    gate = getattr(thread, "_pnex_gate", None)
    if gate is None:
        gate = thread._pnex_gate = threading.Lock()
        gate.acquire()
    return gate


def _describe(waits: Any, warp: _Warp, warp_index: int, group: int, name: str) -> str:
    """What a lane waits at, for a deadlock's report (``waits``: the launch's
    :class:`pnex_magic.launch.waits.Waits`): the operation and the lanes that have not come."""
    missing = [lane for lane in range(warp.lanes) if warp.names[lane] is None]
    several = len(missing) > 1
    who = f"{'lane' if group == 32 else 'thread'}{'s' if several else ''} {waits.ranges(missing)}"
    unit = "warp" if group == 32 else "warpgroup"
    verb = "have" if several else "has"
    return f"the {unit}-level {name} of {unit} {warp_index} ({who} of the {unit} {verb} not come)"


def _wait(gate: Any, warp: _Warp, generation: int, manager: Any, block: tuple, warp_index: int, group: int,
          name: str) -> None:
    """Wait at ``gate`` until ``warp``'s ``generation`` completes; every :data:`_WAIT_S`,
    look whether the launch was aborted.  A wait longer than that is noted in the launch's
    deadlock detection (its block manager's ``pnex_waits``, :mod:`pnex_magic.launch.waits`;
    a lane not noted counts as running, so a short wait costs nothing there), or, in a
    launch without one, fails once a lane that has not arrived has ended."""
    thread = threading.current_thread()
    unit = "warp" if group == 32 else "warpgroup"
    waits = getattr(manager, "pnex_waits", None)
    parked = False
    try:
        while not gate.acquire(timeout=_WAIT_S):
            if getattr(thread, "abort", False):  # (the lanes after this one in the chain see it themselves)
                raise RuntimeError(f"abort flag set while {unit} {warp_index} waited at {name}")
            if waits is not None:
                if not parked:
                    parked = True
                    waits.park(thread, lambda: _describe(waits, warp, warp_index, group, name),
                               lambda: warp.generation != generation)
                continue
            with warp.lock:
                if warp.generation != generation:
                    continue  # opened meanwhile: this gate's turn comes
                gone = _ended_lanes(manager, block, warp_index, group, warp)
                if gone:  # they will never come: the warp fails, every waiting lane with the same error
                    warp.results = _Failed(RuntimeError(
                        f"lane(s) {', '.join(map(str, gone))} of {unit} {warp_index} (block {block}) ended before "
                        f"reaching {name} (an error in that lane, or a return that the others did not take): every "
                        f"lane of a {unit} must execute it"
                    ))
                    warp.open_gates()
    finally:
        if parked:
            waits.unpark(thread)


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


def _ended_lanes(manager: Any, block: tuple, warp_index: int, group: int, warp: _Warp) -> list[int]:
    """The lanes of this warp whose threads have ended without arriving (they raised, or
    returned early): numba's block manager may drop such a thread before it sees its
    exception, and the lanes waiting for it would wait for ever."""
    ended = getattr(manager, _ENDED, None)
    if not ended:
        return []
    first = warp_index * group
    return [lane for lane in range(warp.lanes) if (block, first + lane) in ended and warp.names[lane] is None]


_ENDED = "pnex_ended_threads"  # on a block manager: (block, thread id) of its threads that have ended
_FAILED = "pnex_failed_threads"  # on a block manager: (block, thread id) -> the exception a thread ended with


def track_thread_ends() -> None:
    """Make numba's simulated threads note on their block manager when they end."""
    from numba.cuda.simulator.kernel import BlockThread

    if getattr(BlockThread, "pnex_tracks_ends", False):
        return
    run = BlockThread.run

    def tracked(self: Any) -> None:
        try:
            run(self)
        finally:
            ended = self._manager.__dict__.setdefault(_ENDED, set())
            ended.add((tuple(self.blockIdx), self.thread_id))
            if self.exception:  # a manager may drop it: kept for the threads that wait on this one
                failed = self._manager.__dict__.setdefault(_FAILED, {})
                failed[(tuple(self.blockIdx), self.thread_id)] = self.exception[0]

    BlockThread.run = tracked
    BlockThread.pnex_tracks_ends = True


def checked_collective(name: str, prepare: Callable[[], Any], combine: Callable[[list[Any]], Sequence[Any]],
                       group: int = 32) -> Any:
    """:func:`collective` of the value ``prepare()`` returns after checking this lane's
    operands.  A lane whose check fails still meets its warp, and every lane then raises
    the error of the first lane that failed: a lane that raised on its own would leave
    the others waiting for it."""
    try:
        mine, failure = prepare(), None
    except Exception as exc:  # noqa: BLE001 - handed to the whole warp
        mine, failure = None, exc

    def guarded(lanes: list[Any]) -> Sequence[Any]:
        for failed, _ in lanes:
            if failed is not None:
                raise failed
        return combine([value for _, value in lanes])

    return collective(name, (failure, mine), guarded, group)
