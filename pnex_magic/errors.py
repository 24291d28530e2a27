"""Exceptions raised by pnex_magic.

Every error a user can cause is one of these, and each message names the kernel
and the parameter, expression or line at fault, says what was expected and what
was found.  They subclass the built-in exception a Python programmer would
expect (``TypeError`` for a wrong kind of thing, ``ValueError`` for a wrong
value), so ``except TypeError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "PnexError",
    "KernelDefinitionError",
    "ShapeExpressionError",
    "KernelTypingError",
    "KernelCompileError",
    "ArgumentTypeError",
    "ArgumentShapeError",
    "ArgumentValueError",
    "KernelLaunchError",
    "KernelIndexError",
    "ArtifactError",
    "COMPILER_LOG_NOTE",
]

#: The last line of a typing error's message outside a notebook: where the full log is.
COMPILER_LOG_NOTE = "(the full message is in this exception's .compiler_log)"


class PnexError(Exception):
    """Base class of every exception raised by pnex_magic."""


class KernelDefinitionError(PnexError, TypeError):
    """The kernel's definition is invalid: a missing or bad annotation, an unknown
    dtype, bad ``n_threads``/``threads_per_block``, a misplaced parameter kind."""


class ShapeExpressionError(PnexError, ValueError):
    """A shape or ``n_threads`` expression is malformed or names a parameter it may
    not use."""


class KernelTypingError(KernelDefinitionError):
    """Numba could not type the kernel's body.  ``compiler_log`` holds Numba's full
    message."""

    def __init__(self, message: str, compiler_log: str = "", lineno: int | None = None):
        super().__init__(message)
        self.compiler_log = compiler_log
        self.lineno = lineno


class KernelCompileError(PnexError, RuntimeError):
    """NVVM, nvJitLink or ptxas failed on a kernel that Numba typed.  ``compiler_log``
    holds the tool's full output."""

    def __init__(self, message: str, compiler_log: str = ""):
        super().__init__(message)
        self.compiler_log = compiler_log


class ArgumentTypeError(PnexError, TypeError):
    """An op was called with the wrong number or kind of arguments, a wrong dtype,
    or tensors on mismatched devices."""


class ArgumentShapeError(PnexError, ValueError):
    """A tensor argument has the wrong number of dimensions or a size that does not
    match its declared shape, or a memory layout the kernel cannot write safely (an
    ``InMut`` tensor whose elements overlap, or that shares memory with another
    argument)."""


class ArgumentValueError(ArgumentShapeError):
    """A call's arguments break a rule the kernel states with ``jit(requires=...)``
    (:mod:`pnex_magic.conditions`), e.g. a scalar out of the range the kernel is right
    for.  A subclass of :class:`ArgumentShapeError` (and so of ``ValueError``)."""


class KernelLaunchError(PnexError, RuntimeError):
    """A kernel could not be launched (no back end for the device) or faulted while
    running."""


class KernelIndexError(PnexError, IndexError):
    """A checked launch (``jit(check=True)``, ``%%pnex --check``, ``PNEX_CHECK=1``)
    found an array access out of bounds; the access was not made, and the CUDA
    context is intact.  ``violation`` (:class:`pnex_magic.checking.Violation`) and
    ``site`` (:class:`pnex_magic.checking.Site`) say where."""

    def __init__(self, message: str, violation: object = None, site: object = None):
        super().__init__(message)
        self.violation = violation
        self.site = site


class ArtifactError(PnexError, ValueError):
    """A saved kernel artifact (:func:`pnex_magic.save` / :func:`pnex_magic.load`)
    cannot be written or read: not an artifact, truncated or corrupted, from a newer
    format version, or an op that cannot be saved (its autograd formula is Python code)."""
