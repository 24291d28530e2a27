"""What the tests of bad inputs to the tensor-core primitives share (tests/test_tc_checked_rules.py,
_simulator.py and _compile.py): ``checked`` (an op's checked launch), ``both_refuse``,
``both_run``, ``line_of`` and ``F16``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import pnex_magic as pnex
from pnex_magic.launch import checks


F16 = np.float16


def checked(op, *args, **kwargs):
    """``op``'s checked launch (its checked variant, in the simulator for CPU tensors)."""
    with checks.checked_launches(op._pnex):
        return op(*args, **kwargs)


def both_refuse(op, args, kwargs, plain, in_checked):
    """The simulator refuses the call (``plain`` matches its message) and the checked
    launch records it (``in_checked`` matches the KernelIndexError's)."""
    with pytest.raises(pnex.KernelLaunchError, match=plain):
        op(*args, **kwargs)
    with pytest.raises(pnex.KernelIndexError, match=in_checked) as info:
        checked(op, *args, **kwargs)
    return info.value


def both_run(op, args, kwargs):
    """The same result unchecked and checked (no violation recorded)."""
    plain = op(*args, **kwargs)
    again = checked(op, *args, **kwargs)
    assert torch.equal(plain, again)
    return plain


def line_of(op, text):
    lines = Path(op._pnex.fn.__code__.co_filename).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if text in line)
