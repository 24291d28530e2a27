"""What the tests of simulated launches that could hang share (tests/test_simulator_deadlock.py,
test_simulator_turns.py): :func:`abort_simulated_threads`, what numba-cuda's simulator does to
the blocks of a launch that failed, so that a hung launch raises and the next test runs."""

from __future__ import annotations

import threading


def abort_simulated_threads() -> None:
    """Let every simulated thread of this process raise at its next barrier or wait."""
    from numba.cuda.simulator.kernel import BlockThread

    for t in threading.enumerate():
        if isinstance(t, BlockThread):
            t.abort = True
            t.syncthreads_blocked = False
            t.syncthreads_event.set()
