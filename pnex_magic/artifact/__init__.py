"""Saved artifacts: a pnex op as one self-contained file that runs with torch alone.

:func:`save` writes an op (and the backward op attached to it) as data: the schema
and spec (shape and ``n_threads`` expressions as text), the launch description the
C++ launcher runs, and per input layout the kernel's cubins for a list of GPU
architectures plus its PTX as a fallback (:mod:`pnex_magic.multiarch`), in a zip
file with checksums (:mod:`.archive`, :mod:`.manifest`).

:func:`load` registers the ops again, through the same core path as a definition
(:func:`pnex_magic.define.registered`), from a
:class:`~pnex_magic.artifact.kernel.SavedKernel` instead of a
:class:`~pnex_magic.definition.KernelDefinition`: the C++ launcher, the fake
implementation (``torch.compile``, ``torch.export``), CUDA graphs and autograd work
as for the op that was saved.  Loading imports neither Numba nor NVVM nor nvJitLink
and runs no code from the file: the manifest is JSON, expressions are parsed, never
``eval``-ed.  An autograd formula written in Python (``register_autograd``, or
``attach_backward`` with a custom ``setup_context``) is code, so :func:`save` refuses
such an op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
from collections.abc import Iterable
from pathlib import Path

import torch

from .. import autograd
from ..define import registered
from ..definition import KernelDefinition
from ..errors import ArtifactError, KernelCompileError
from ..multiarch import DEFAULT_ARCHS, LAYOUTS, build_images, target_archs
from ..launch import autotune
from ..launch.hidden import hidden_arrays
from ..op import PnexOp
from ..spec import KernelSpec, TuneParam
from .archive import FORMAT_VERSION, read_archive, write_archive
from .kernel import SavedKernel
from .manifest import op_entry, read_op_entry

__all__ = ["save", "load", "DEFAULT_ARCHS", "FORMAT_VERSION", "SavedKernel"]


def _op_name(op: PnexOp) -> str:
    return op._pnex.op_name


def _backward_of(op: PnexOp) -> PnexOp | None:
    """The pnex backward op attached to ``op`` (``None`` without one); an autograd
    formula that is Python code cannot be saved."""
    if getattr(op, "_backward_fn", None) is None:
        return None
    name = op._pnex.spec.name
    attached = autograd.attached_backward(op)
    if attached is None:
        raise ArtifactError(
            f"cannot save {name!r}: its autograd formula was registered with register_autograd(), which is "
            f"Python code, and an artifact holds data only. Attach a pnex backward op with "
            f"pnex.attach_backward({name}, backward_op) instead"
        )
    if attached.custom_context:
        raise ArtifactError(
            f"cannot save {name!r}: its backward op {attached.backward.spec.name!r} was attached with a custom "
            f"setup_context, which is Python code, and an artifact holds data only. Attach it without "
            f"setup_context (pnex then saves the forward tensors and scalars the backward op names)"
        )
    return attached.backward


def _ops_to_save(op: PnexOp) -> list[tuple[PnexOp, PnexOp | None]]:
    """``op`` first, then its backward op, that one's backward op, ..."""
    found: list[tuple[PnexOp, PnexOp | None]] = []
    seen: set[str] = set()
    current: PnexOp | None = op
    while current is not None and _op_name(current) not in seen:
        if current._superseded is not None:
            raise current._superseded.error(current._pnex.spec.name)
        if not isinstance(current._pnex, KernelDefinition):
            where = getattr(current._pnex, "origin", "an artifact")
            raise ArtifactError(
                f"cannot save {current._pnex.spec.name!r}: it was loaded from {where}; copy that file instead"
            )
        seen.add(_op_name(current))
        backward = _backward_of(current)
        found.append((current, backward))
        current = backward
    return found


def _saved_variants(definition: KernelDefinition, tuned_only: bool) -> tuple[KernelSpec, list[int]]:
    """The spec to save and the definition's ``Tune`` variants it holds, in its order:
    every variant, or (``tuned_only``) the product of the values the autotuner chose
    for some key in this process."""
    spec = definition.spec
    every = list(range(len(spec.tune_variants)))
    if not tuned_only or len(every) == 1:
        return spec, every
    chosen: dict[str, set] = {p.name: set() for p in spec.tune_params}
    for result in autotune.results(definition):
        if not result.source.startswith("first candidate"):  # benchmarked here, or read from disk
            for name, value in result.tune:
                chosen[name].add(value)
    if not all(chosen.values()):
        raise ArtifactError(
            f"cannot save {spec.name!r} with tuned_only=True: the autotuner has not chosen its Tune values in this "
            f"process yet; call the op on representative CUDA inputs first (or save every variant)"
        )
    params = tuple(
        dataclasses.replace(p, choices=tuple(c for c in p.choices if c in chosen[p.name]))
        if isinstance(p, TuneParam) else p
        for p in spec.params
    )
    saved = dataclasses.replace(spec, params=params)
    keep = [spec.tune_variants.index(values) for values in saved.tune_variants]
    return saved, keep


def save(
    op: PnexOp,
    path: str | os.PathLike,
    *,
    archs: str | Iterable[str] = DEFAULT_ARCHS,
    tuned_only: bool = False,
) -> Path:
    """Save ``op`` (with the backward op attached to it) as one artifact file.

    The file holds the op's schema, its parameters and shape rules, the launch
    description and, for each of ``archs``, cubins for contiguous and strided
    inputs, plus the PTX for the oldest of them as a fallback for newer GPUs.
    No GPU is needed.  :func:`load` registers the op again in a process that has
    torch and pnex_magic's launcher only (no Numba, NVVM or nvJitLink).

    Parameters
    ----------
    op : PnexOp
        An op made by ``pnex.jit`` or ``%%pnex``.
    path : str or os.PathLike
        The file to write (``.pnex`` by convention); replaced if it exists.
    archs : iterable of str, default ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100")
        GPU architectures to ship cubins for.
    tuned_only : bool, default False
        For a kernel with ``Tune`` parameters: save only the values the autotuner
        chose in this process (for any key) instead of every variant's code.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ArtifactError
        The op's autograd formula is Python code (``register_autograd``, or a
        custom ``setup_context``), the op was itself loaded from an artifact, or its
        kernel reads a device array as a global (passed by reference at each launch).
    KernelCompileError
        No CUDA compiler (NVVM, nvJitLink) is installed here, or it cannot build
        for one of ``archs``.
    """
    if not isinstance(op, PnexOp):
        raise ArtifactError(f"pnex.save() saves an op made by pnex.jit or %%pnex, got {op!r}")
    archs = target_archs(archs)
    entries, files = [], {}
    for current, backward in _ops_to_save(op):
        definition = current._pnex
        hidden = [h.name for h in hidden_arrays(definition)]
        if hidden:
            raise ArtifactError(
                f"cannot save {definition.spec.name!r}: it reads the device array(s) {', '.join(map(repr, hidden))} as "
                f"globals, which pnex passes to the kernel at each launch as they are in this process (hidden "
                f"arguments); an artifact cannot hold them. Make each a parameter of the kernel (an In or InMut "
                f"argument) to save it"
            )
        if not definition.compiles:
            raise KernelCompileError(
                f"cannot save {definition.spec.name!r}: it was not compiled ({definition.toolchain_error}); "
                f"install the CUDA compiler wheels: pip install 'numba-cuda[cu13]' (or '[cu12]')"
            )
        spec, variants = _saved_variants(definition, tuned_only)
        images = tuple({layout: build_images(definition, archs, layout, v) for layout in LAYOUTS} for v in variants)
        entry, entry_files = op_entry(
            definition.op_name,
            spec,
            images,
            definition.options.max_registers,
            None if backward is None else _op_name(backward),
            cooperative=definition.cooperative,
        )
        entries.append(entry)
        files.update(entry_files)
    manifest = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "archs": list(archs),
        "op": entries[0]["op_name"],
        "ops": entries,
    }
    return write_archive(path, manifest, files)


def load(path: str | os.PathLike, *, sha256: str | None = None) -> PnexOp:
    """Register the op saved in ``path`` (and its backward op) and return it.

    The op is ``torch.ops.pnex.<name>`` again, with the same schema, checks, errors
    and launcher as the op that was saved; it works eagerly on CUDA tensors, under
    ``torch.compile``, ``torch.export`` and AOTInductor, in CUDA graphs and, with its
    saved backward op, under autograd.  It cannot run on CPU tensors (an artifact
    has no Python source for the CUDA simulator).  Loading an op whose name is
    registered already replaces it, as re-running a definition does.

    An artifact carries GPU code (cubins and PTX the driver runs on your GPU), so
    load only files you trust, as you would a pickle.  Its internal checksums catch
    damage, not tampering: anyone who can write the file can rewrite them too.

    Parameters
    ----------
    path
        The ``.pnex`` file, as written by :func:`save`.
    sha256
        The SHA-256 of the whole file you expect (64 hexadecimal digits, as
        ``sha256sum`` prints or ``hashlib.sha256(data).hexdigest()`` gives), taken
        where the file was made or from a source you trust.  A file whose digest
        differs is refused before anything in it is parsed or registered.

    Raises
    ------
    ArtifactError
        The file is missing, not an artifact, truncated or damaged, from a newer
        artifact format than this pnex_magic reads, or (with ``sha256``) not the
        file expected: the message names both digests.

    Examples
    --------
    >>> import hashlib
    >>> path = pnex.save(muladd, "muladd.pnex")                   # doctest: +SKIP
    >>> digest = hashlib.sha256(path.read_bytes()).hexdigest()    # doctest: +SKIP
    >>> muladd = pnex.load("muladd.pnex", sha256=digest)          # doctest: +SKIP
    """
    manifest, files = read_archive(path, sha256=sha256)
    where = str(path)
    raw_ops = manifest.get("ops")
    if not isinstance(raw_ops, list) or not raw_ops:
        raise ArtifactError(f"{where} is not a usable pnex artifact: its manifest lists no ops")
    entries = [read_op_entry(raw, files, where) for raw in raw_ops]
    names = [e.op_name for e in entries]
    for e in entries:
        if e.backward is not None and e.backward not in names:
            raise ArtifactError(f"{where}: op {e.op_name!r} names a backward op {e.backward!r} the artifact does not hold")
    if os.environ.get("PNEX_CHECK", "0") == "1":
        import logging

        logging.getLogger(__name__).warning(
            "pnex: PNEX_CHECK=1, but %s holds the fast code of its kernels only (a checked variant is built from "
            "the kernel's Python source): its launches are not checked", where,
        )
    with contextlib.ExitStack() as stack:
        ops = {e.op_name: stack.enter_context(registered(SavedKernel(e, where))) for e in entries}
        for e in entries:
            if e.backward is not None:
                autograd.attach_backward(ops[e.op_name], ops[e.backward])
    return ops[entries[0].op_name]
