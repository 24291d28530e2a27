"""One op in an artifact's manifest, as JSON: its name and schema, its spec (the
parameters with their role, dtype name, shape expression texts and ``init``, a
scalar's ``default`` and an ``InMut``'s ``may_alias`` where given, a ``Tune``
parameter's ``choices``; the ``n_threads`` texts, the block and, where there is any,
the ``shared_bytes`` text: dynamic shared memory per block), the launch
description the C++ launcher runs
(:func:`~pnex_magic.launch.description.describe_launch`), and per input layout the
PTX and cubin files: under ``layouts`` for the first ``Tune`` variant (the only one of
a kernel without ``Tune`` parameters), under ``tune_layouts`` for the others.

Reading builds the spec again the way :func:`~pnex_magic.spec.build_spec` does:
every expression text is parsed by
:func:`~pnex_magic.expressions.parse_expression` (never ``eval``-ed) over the
parameters declared before it, and the result must give the saved schema and launch
description back exactly, so a manifest that parses but does not describe its op is
refused too.  Every problem is an :class:`~pnex_magic.errors.ArtifactError`.
"""

from __future__ import annotations

import dataclasses
import json
import keyword
from collections.abc import Mapping
from typing import Any

from ..blocks import parse_autotune_key, parse_threads_per_block
from ..clusters import parse_cluster_dims, ptx_cluster_dims
from ..conditions import kept_combinations
from ..dtypes import resolve_dtype
from ..errors import ArtifactError, KernelDefinitionError, PnexError, ShapeExpressionError
from ..expressions import NameInfo, parse_expression
from ..launch.description import describe_launch
from ..linking import uses_grid_sync
from ..multiarch import LAYOUTS, ArchImages, target_archs
from ..spec import KernelSpec, ScalarParam, SeedParam, TensorParam, TuneParam, UnusedParam
from ..spec.validate import argument_rules, shared_bytes_expression, tune_rules

__all__ = ["OpEntry", "op_entry", "read_op_entry"]

_MEMORY_CHECKS = {"internal_overlap", "overlap"}  # launch description keys added in format 2
_SHARED = "shared"  # the launch description's dynamic shared memory per variant, added in format 4


@dataclasses.dataclass(frozen=True)
class OpEntry:
    """What the manifest says about one op, read back and checked."""

    op_name: str
    spec: KernelSpec
    images: tuple[dict[str, ArchImages], ...]  # per Tune variant, per input layout
    max_registers: int | None
    backward: str | None  # the op name of its attached backward op
    cooperative: bool = False  # it synchronises its grid: launched cooperatively


def _spec_json(spec: KernelSpec) -> dict[str, Any]:
    params = []
    for p in spec.params:
        entry: dict[str, Any] = {"name": p.name, "role": p.role}
        if isinstance(p, TensorParam):
            entry.update(dtype=p.dtype.name, shape=[None if e is None else str(e) for e in p.shape], init=p.init)
            if p.may_alias:
                entry["may_alias"] = list(p.may_alias)
        elif isinstance(p, ScalarParam):
            entry.update(dtype=p.dtype.name)
            if p.has_default:
                entry["default"] = p.default
        elif isinstance(p, TuneParam):
            entry["choices"] = list(p.choices)
        params.append(entry)
    return {
        "name": spec.name,
        "qualname": spec.qualname,
        "module": spec.module,
        "params": params,
        "n_threads": [str(e) for e in spec.n_threads],
        "threads_per_block": list(spec.threads_per_block),
        # Autotuning (absent from artifacts saved before it existed: a fixed block).
        "candidates": [list(c) for c in spec.candidates],
        "autotune_key": None if spec.autotune_key is None else [str(e) for e in spec.autotune_key],
        # Dynamic shared memory per block (format 4; absent: none).
        "shared_bytes": str(spec.shared_bytes),
        # Thread-block clusters (written only for a kernel that has them: other files read as before).
        **({"cluster_dims": list(spec.cluster_dims)} if spec.cluster_dims is not None else {}),
        # The rules on the arguments (jit(requires=...), format 5; absent: none).
        # [[condition, what it means], ...], in order (the manifest's keys are sorted).
        **({"requires": [[r.text, r.why] for r in spec.requires]} if spec.requires else {}),
        # The rules that keep combinations of Tune choices (jit(tune_requires=...), format 6; absent: none):
        # they number the variants whose code the file holds.
        **({"tune_requires": [[r.text, r.why] for r in spec.tune_rules]} if spec.tune_rules else {}),
    }


def _plain(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def op_entry(
    op_name: str,
    spec: KernelSpec,
    images: tuple[Mapping[str, ArchImages], ...],
    max_registers: int | None,
    backward: str | None,
    cooperative: bool = False,
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest entry of one op and the files it refers to; ``images`` holds the
    code per ``Tune`` variant of ``spec`` (one entry without ``Tune`` parameters), per
    input layout; ``cooperative``: the kernel synchronises its grid (written only then,
    so files of other kernels read as before)."""
    files: dict[str, bytes] = {}
    per_variant = []
    for variant, by_layout in enumerate(images):
        layouts = {}
        for layout, img in by_layout.items():
            folder = f"ops/{op_name}/{layout}" if variant == 0 else f"ops/{op_name}/v{variant}/{layout}"
            files[f"{folder}/kernel.ptx"] = img.ptx.encode()
            cubins = {}
            for arch, cubin in img.cubins.items():
                files[f"{folder}/{arch}.cubin"] = cubin
                cubins[arch] = f"{folder}/{arch}.cubin"
            layouts[layout] = {"entry": img.entry, "ptx_arch": img.ptx_arch, "ptx": f"{folder}/kernel.ptx",
                               "cubins": cubins}
        per_variant.append(layouts)
    entry = {
        "op_name": op_name,
        "schema": spec.schema,
        "spec": _spec_json(spec),
        "launch": _plain(describe_launch(spec)),
        "max_registers": max_registers,
        "layouts": per_variant[0],
        "backward": backward,
    }
    if len(per_variant) > 1:
        entry["tune_layouts"] = per_variant[1:]
    if cooperative:
        entry["cooperative"] = True
    return entry, files


# ---------------------------------------------------------------- reading


class _Malformed(Exception):
    """A problem in the manifest, turned into an ArtifactError naming the op."""


def _get(d: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise _Malformed(f"{what} has no {key!r}")
    value = d[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _Malformed(f"{what}: {key!r} is {value!r}")
    return value


def _identifier(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.isidentifier() or keyword.iskeyword(value):
        raise _Malformed(f"{what} is {value!r}, not a Python identifier")
    return value


def _param(
    e: Any, visible: dict[str, NameInfo], kernel: str
) -> TensorParam | ScalarParam | UnusedParam | TuneParam | SeedParam:
    name = _identifier(_get(e, "name", str, "a parameter"), "a parameter name")
    what = f"parameter {name!r}"
    role = _get(e, "role", str, what)
    if role == "unused":
        return UnusedParam(name)
    if role == "seed":
        return SeedParam(name)
    if role == "tune":
        choices = _get(e, "choices", list, what)
        kinds = {type(c) for c in choices}
        if not choices or len(kinds) != 1 or not kinds <= {int, float, bool} or len(set(choices)) != len(choices):
            raise _Malformed(f"{what}: choices {choices!r}")
        param = TuneParam(name, tuple(choices))
        visible[name] = NameInfo("scalar", integral=param.kind == "int")
        return param
    dtype = resolve_dtype(_get(e, "dtype", str, what))
    if dtype is None:
        raise _Malformed(f"{what} has an unknown dtype {e['dtype']!r}")
    if role == "scalar":
        visible[name] = NameInfo("scalar", integral=not dtype.is_floating_point and dtype.name != "bool")
        default = e.get("default")
        if default is not None and not isinstance(default, (bool, int, float)):
            raise _Malformed(f"{what}: default is {default!r}")
        return ScalarParam(name, dtype, default=default)  # the schema check below checks it further
    if role not in ("in", "inmut", "out"):
        raise _Malformed(f"{what} has an unknown role {role!r}")
    shape = []
    for axis, text in enumerate(_get(e, "shape", list, what)):
        if text is None and role != "out":
            shape.append(None)
            continue
        if not isinstance(text, str):
            raise _Malformed(f"{what}: shape[{axis}] is {text!r}, not an expression text")
        where = f"kernel {kernel!r}, parameter {name!r}, shape[{axis}]"
        shape.append(parse_expression(text, visible, where=where, axis=axis))
    init = e.get("init")
    if init is not None and not isinstance(init, (bool, int, float)):
        raise _Malformed(f"{what}: init is {init!r}")
    may_alias = e.get("may_alias", [])
    if not isinstance(may_alias, list) or not all(isinstance(n, str) for n in may_alias) or (
        may_alias and role != "inmut"
    ):
        raise _Malformed(f"{what}: may_alias is {may_alias!r}")
    visible[name] = NameInfo("tensor", ndim=len(shape))
    return TensorParam(name, role, dtype, tuple(shape), init, tuple(may_alias))


def _spec(d: Any) -> KernelSpec:
    kernel = _identifier(_get(d, "name", str, "the spec"), "the kernel name")
    visible: dict[str, NameInfo] = {}
    params = tuple(_param(e, visible, kernel) for e in _get(d, "params", list, "the spec"))
    if len({p.name for p in params}) != len(params):
        raise _Malformed("two parameters have the same name")
    inputs = {p.name for p in params if isinstance(p, TensorParam) and p.is_input}
    for p in params:
        if isinstance(p, TensorParam) and not set(p.may_alias) <= inputs - {p.name}:
            raise _Malformed(f"parameter {p.name!r}: may_alias {list(p.may_alias)} names no other tensor argument")
    texts = _get(d, "n_threads", list, "the spec")
    tpb = _get(d, "threads_per_block", list, "the spec")
    if not 1 <= len(texts) <= 3 or len(tpb) != len(texts):
        raise _Malformed(f"n_threads {texts!r} and threads_per_block {tpb!r} do not describe a launch")
    if any(isinstance(t, bool) or not isinstance(t, int) or t <= 0 for t in tpb):
        raise _Malformed(f"threads_per_block {tpb!r} is not a list of positive ints")
    if not all(isinstance(t, str) for t in texts):
        raise _Malformed(f"n_threads {texts!r} is not a list of expression texts")
    n_threads = tuple(
        parse_expression(t, visible, where=f"kernel {kernel!r}, n_threads[{i}]") for i, t in enumerate(texts)
    )
    candidates, key = _tuning(d, kernel, tpb, len(texts), params, visible)
    tune_params = [p for p in params if isinstance(p, TuneParam)]
    try:
        kept = _rule_pairs(d, "tune_requires")
        tune_rules_ = tune_rules(kernel, None if kept is None else {t: w for t, w in kept}, params, visible)
        combinations = kept_combinations(kernel, [p.name for p in tune_params], [p.choices for p in tune_params],
                                         tune_rules_)
    except ShapeExpressionError as exc:
        raise _Malformed(str(exc)) from None
    shared = d.get("shared_bytes", "0")  # saved before dynamic shared memory (format 3 and older): none
    if not isinstance(shared, str):
        raise _Malformed(f"shared_bytes {shared!r} is not an expression text")
    try:
        shared_bytes = shared_bytes_expression(kernel, shared, tune_params, visible, combinations)
    except KernelDefinitionError as exc:
        raise _Malformed(str(exc)) from None
    try:
        cluster_dims = parse_cluster_dims(kernel, d.get("cluster_dims"), len(texts))
    except KernelDefinitionError as exc:
        raise _Malformed(str(exc)) from None
    try:
        saved = _rule_pairs(d, "requires")
        requires = argument_rules(kernel, None if saved is None else {t: w for t, w in saved}, params, visible)
    except ShapeExpressionError as exc:
        raise _Malformed(str(exc)) from None
    return KernelSpec(
        name=kernel,
        qualname=_get(d, "qualname", str, "the spec"),
        module=_get(d, "module", str, "the spec"),
        params=params,
        n_threads=n_threads,
        threads_per_block=tuple(tpb),
        candidates=candidates,
        autotune_key=key,
        shared_bytes=shared_bytes,
        cluster_dims=cluster_dims,
        requires=requires,
        tune_rules=tune_rules_,
    )


def _rule_pairs(d: dict, key: str) -> list | None:
    """The saved ``key`` rules ([[condition, meaning], ...]), or ``None`` where absent."""
    saved = d.get(key)
    if saved is not None and not (isinstance(saved, list) and all(
            isinstance(e, list) and len(e) == 2 and all(isinstance(s, str) for s in e) for e in saved)):
        raise _Malformed(f"{key} {saved!r} is not a list of [condition, meaning] pairs")
    return saved


def _tuning(d: dict, kernel: str, tpb: list, ndim: int, params: tuple, visible: dict[str, NameInfo]) -> tuple:
    """The autotune candidates and key of a saved spec (none in older artifacts)."""
    saved = d.get("candidates") or []
    key_texts = d.get("autotune_key")
    variants = 1
    for p in params:
        if isinstance(p, TuneParam):
            variants *= len(p.choices)
    if not saved and variants == 1:
        if key_texts is not None:
            raise _Malformed("it has an autotune key but no candidates")
        return (), None
    if not isinstance(saved, list) or not all(isinstance(c, list) for c in saved):
        raise _Malformed(f"candidates {saved!r} is not a list of block shapes")
    arguments = {p.name: visible[p.name] for p in params if p.role in ("in", "inmut", "scalar")}
    arguments.update({p.name: visible[p.name] for p in params if isinstance(p, TuneParam) and len(p.choices) == 1})
    try:
        candidates = parse_threads_per_block(kernel, [tuple(c) for c in saved], ndim) if saved else ()
        key = parse_autotune_key(kernel, key_texts, arguments, autotuned=True)
    except (KernelDefinitionError, ShapeExpressionError) as exc:
        raise _Malformed(str(exc)) from None
    if saved and (len(candidates) < 2 or list(candidates[0]) != list(tpb)):
        raise _Malformed(f"candidates {saved!r} do not start with threads_per_block {tpb!r}")
    return candidates, key


def _images(layout: str, d: Any, files: Mapping[str, bytes]) -> ArchImages:
    what = f"layout {layout!r}"

    def file(name: Any) -> bytes:
        if not isinstance(name, str) or name not in files:
            raise _Malformed(f"{what} refers to {name!r}, which the artifact does not list")
        return files[name]

    try:
        ptx = file(_get(d, "ptx", str, what)).decode()
    except UnicodeDecodeError:
        raise _Malformed(f"{what}: the PTX is not text") from None
    cubins = {}
    for arch, name in _get(d, "cubins", dict, what).items():
        (canonical,) = target_archs(arch)
        cubins[canonical] = file(name)
    (ptx_arch,) = target_archs(_get(d, "ptx_arch", str, what))
    entry = _get(d, "entry", str, what)
    return ArchImages(layout=layout, ptx_arch=ptx_arch, entry=entry, ptx=ptx, cubins=cubins)


def read_op_entry(d: Any, files: Mapping[str, bytes], where: str) -> OpEntry:
    """One op of the manifest, checked; ``where`` names the artifact in errors."""
    name = d.get("op_name") if isinstance(d, dict) else None
    try:
        op_name = _identifier(_get(d, "op_name", str, "an op"), "the op name")
        spec = _spec(_get(d, "spec", dict, "the op"))
        if spec.schema != d.get("schema"):
            raise _Malformed(f"its spec gives the schema {spec.schema}, not the saved {d.get('schema')}")
        launch, saved = _plain(describe_launch(spec)), d.get("launch")
        if isinstance(saved, dict) and not _MEMORY_CHECKS & saved.keys():
            # Format 1, from before the InMut memory checks: they follow from the spec.
            launch = {k: v for k, v in launch.items() if k not in _MEMORY_CHECKS}
        if isinstance(saved, dict) and _SHARED not in saved and not any(spec.shared_per_variant):
            # Formats 1 to 3, from before dynamic shared memory: none.
            launch = {k: v for k, v in launch.items() if k != _SHARED}
        if isinstance(saved, dict) and "tune" not in saved and not spec.tune_params:
            # Formats 1 and 2, from before Tune: candidates are blocks, with no variant.
            launch = {k: v for k, v in launch.items() if k not in ("tune", "variants")}
            launch["candidates"] = [c[:3] for c in launch["candidates"]]
        if launch != saved:
            raise _Malformed("its spec does not give the saved launch description")
        per_variant = [_get(d, "layouts", dict, "the op"), *d.get("tune_layouts", [])]
        if len(per_variant) != len(spec.tune_variants):
            raise _Malformed(f"it has code for {len(per_variant)} Tune variant(s), its spec {len(spec.tune_variants)}")
        images = []
        for layouts in per_variant:
            if not isinstance(layouts, dict) or sorted(layouts) != sorted(LAYOUTS):
                raise _Malformed(f"it has code for layouts {sorted(layouts) if isinstance(layouts, dict) else layouts}, "
                                 f"not {list(LAYOUTS)}")
            images.append({layout: _images(layout, layouts[layout], files) for layout in LAYOUTS})
        images = tuple(images)
        max_registers = d.get("max_registers")
        if max_registers is not None and (isinstance(max_registers, bool) or not isinstance(max_registers, int)):
            raise _Malformed(f"max_registers is {max_registers!r}")
        backward = d.get("backward")
        if backward is not None:
            backward = _identifier(backward, "the backward op name")
        cooperative = d.get("cooperative", False)
        if not isinstance(cooperative, bool):
            raise _Malformed(f"cooperative is {cooperative!r}")
        # Its PTX says so too: a file that lost the flag still launches cooperatively.
        cooperative = cooperative or any(uses_grid_sync(img.ptx) for layouts in images for img in layouts.values())
        shapes = {ptx_cluster_dims(img.ptx) for layouts in images for img in layouts.values()}
        if shapes != {spec.cluster_dims}:  # the code launches clusters of the shape its PTX declares
            raise _Malformed(f"its spec gives cluster_dims={spec.cluster_dims}, its code {sorted(shapes, key=str)}")
    except (_Malformed, PnexError) as exc:
        raise ArtifactError(f"{where}: op {name!r} is malformed in the manifest: {exc}") from None
    return OpEntry(op_name, spec, images, max_registers, backward, cooperative)
