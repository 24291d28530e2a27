"""What the tests of user errors share (tests/test_errors_*.py): ``raises_named`` (pytest.raises
with a pattern) and ``define`` (pnex.jit with ``n_threads="a.numel()"`` unless given)."""

import pytest

import pnex_magic as pnex


def raises_named(exc_type, pattern):
    return pytest.raises(exc_type, match=pattern)


def define(fn, **options):
    options.setdefault("n_threads", "a.numel()")
    return pnex.jit(**options)(fn)
