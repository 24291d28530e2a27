"""Click-stream sessionization with a grid-wide sync: numba-cuda's
``doc_examples/test_sessionize.py``, ported to pnex.

The kernel's body is the documentation's: a thread whose click starts a session (a new
user, or more than ``session_timeout`` after the previous click) writes its own index,
the grid synchronises, and each such thread then labels the clicks after it until the
next session's start.  ``session_timeout`` is a local of the defining function, read by
the kernel as a closure variable (frozen when it is defined, as Numba does).
``results`` is the docs' zero-filled device array, written in place (``InMut``); the
docs launch ``sessionize.forall(len(ids))``.

Two properties of the docs' kernel decide the inputs.  Only the threads that start a
session reach ``grid.sync()``, and CUDA's grid sync counts each block by its thread 0:
with several blocks, one whose first click does not start a session would make the
others wait forever.  ``forall`` launches the docs' 28 clicks as one block, and so does
the port (one block of 1024 threads; up to 1024 clicks).  And the last thread's
look-ahead stops only at the last element, so the last session must hold at least three
clicks (a shorter one reads past the end): the random click streams here end with one.
"""

from __future__ import annotations

import numpy as np
import torch

import pnex_magic as pnex

TITLE = "click-stream sessionization (a grid sync between marking and labelling sessions)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_sessionize.py: test_ex_sessionize, sessionize"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # indices: exact

# The docs' timeout: np.int64(np.timedelta64("3600", "s")) is 3600, compared with differences of
# int64 timestamps (the docs' datetime64[ns] values cast to int64), so 3600 timestamp units.
SESSION_TIMEOUT = int(np.int64(np.timedelta64("3600", "s")))


def define():
    from numba import cuda

    # Set the timeout to one hour
    session_timeout = np.int64(np.timedelta64("3600", "s"))

    @pnex.jit(n_threads="len(user_id)", threads_per_block=1024)  # forall's one block
    def sessionize(user_id: pnex.In("i64", (None,)), timestamp: pnex.In("i64", "user_id"),
                   results: pnex.InMut("f64", "user_id")):
        gid = cuda.grid(1)
        size = len(user_id)

        if gid >= size:
            return

        # Determine session boundaries
        is_first_datapoint = gid == 0
        if not is_first_datapoint:
            new_user = user_id[gid] != user_id[gid - 1]
            timed_out = (
                timestamp[gid] - timestamp[gid - 1] > session_timeout
            )
            is_sess_boundary = new_user or timed_out
        else:
            is_sess_boundary = True

        # Determine session labels
        if is_sess_boundary:
            # This thread marks the start of a session
            results[gid] = gid

            # Make sure all session boundaries are written
            # before populating the session id
            grid = cuda.cg.this_grid()
            grid.sync()

            look_ahead = 1
            # Check elements 'forward' of this one
            # until a new session boundary is found
            while results[gid + look_ahead] == 0:
                results[gid + look_ahead] = gid
                look_ahead += 1
                # Avoid out-of-bounds accesses by the last thread
                if gid + look_ahead == size - 1:
                    results[gid + look_ahead] = gid
                    break

    return sessionize


def clicks(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` clicks of a few users, sorted by user then time, with gaps of 1 to 40,000
    timestamp units, some on either side of the 3600 timeout; the last three clicks are
    one session."""
    rng = np.random.default_rng(seed)
    users = np.sort(rng.integers(1, max(2, n // 12), n))
    users[-3:] = users[-3]
    gaps = rng.choice([1, 60, 3000, 3599, 3601, 7200, 40000], n, p=[0.3, 0.3, 0.1, 0.05, 0.05, 0.1, 0.1])
    gaps[-2:] = 1
    stamps = np.cumsum(gaps.astype(np.int64))
    return users.astype(np.int64), stamps


def reference(user_id: np.ndarray, timestamp: np.ndarray) -> np.ndarray:
    """Each click's session: the index of the click that started it."""
    starts = np.ones(user_id.size, bool)
    starts[1:] = (user_id[1:] != user_id[:-1]) | (np.diff(timestamp) > SESSION_TIMEOUT)
    return np.maximum.accumulate(np.where(starts, np.arange(user_id.size), 0)).astype(np.float64)


def _size(device: str) -> int:
    return 1000 if device != "cpu" else 60  # one block of 1024 threads either way (see above)


def run(device: str, seed: int) -> tuple[dict, dict]:
    sessionize = define()
    users, stamps = clicks(_size(device), seed)
    user_id, timestamp = torch.from_numpy(users).to(device), torch.from_numpy(stamps).to(device)
    results = torch.zeros(users.size, dtype=torch.float64, device=device)  # the docs' np.zeros(len(ids))
    sessionize(user_id, timestamp, results)
    return {"results": results}, {"results": torch.from_numpy(reference(users, stamps))}


def timed(device: str):
    sessionize = define()
    users, stamps = clicks(_size(device), 0)
    user_id, timestamp = torch.from_numpy(users).to(device), torch.from_numpy(stamps).to(device)
    results = torch.zeros(users.size, dtype=torch.float64, device=device)

    def torch_sessions():  # session starts, then a running maximum of their indices
        starts = torch.ones_like(user_id, dtype=torch.bool)
        starts[1:] = (user_id[1:] != user_id[:-1]) | (timestamp.diff() > SESSION_TIMEOUT)
        index = torch.arange(user_id.numel(), device=user_id.device)
        return torch.cummax(torch.where(starts, index, 0), 0).values

    def pnex_sessions():
        results.zero_()
        sessionize(user_id, timestamp, results)

    return pnex_sessions, torch_sessions
