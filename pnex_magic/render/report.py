"""The ``%%pnex`` report: one object, three renderings.

:class:`PnexReport` holds what one ``%%pnex`` cell built: the core's
:class:`~pnex_magic.report.KernelReport` (from :func:`~pnex_magic.report.build_report`)
and what the cell bound.  It renders as

* HTML (:meth:`PnexReport.to_html`) with the tabs Signature, Launch, PTX, SASS,
  Resources and Timing, made of CSS alone (no script, no widget state), so the
  live notebook, a reopened or converted one and nbviewer show the same report;
  where a sanitiser drops the CSS (an untrusted notebook, GitHub), a compact text
  summary (:meth:`PnexReport.summary`) shows instead;
* plain text (:meth:`PnexReport.to_text`): for terminal IPython and logs;
* on request, an ipywidgets ``Tab`` (:meth:`PnexReport.widget`), core widgets only.

Displayed, it offers HTML and text (``_repr_mimebundle_``): no widget view,
because a widget view shows only while its kernel lives.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..efficiency import share_text
from ..op import attached_backward
from ..report import KernelReport, occupancy, sass_summary
from ..sass import NO_DISASSEMBLER, Disassembly
from ..spec import ScalarParam
from ..timing import TimingResult, format_bytes, format_rate, format_time, rate_unit
from .html import (
    ACCENT, BORDER, ERR, FG_MUTED, OK, WARN, badge, code, escape, log_details_html, note, pre, readable, static_view,
    table, tabs, themed,
)
from .listings import PtxLexer, SassLexer, highlight, listing, python_lexer
from .profile import compute_html, profile_html
from .summary import summary_text
from .tuning import autotune_html, efficiency_html, shows_autotune

__all__ = ["PnexReport", "TAB_TITLES", "SAME_OP", "REDEFINED"]

TAB_TITLES = ("Signature", "Launch", "PTX", "SASS", "Resources", "Timing")
#: What a cell says when the name already held the op it binds (the same kernel, run again).
SAME_OP = "the same op it held before: the same kernel, bound again"
#: ... and when the name held the op of the same name (an op's name comes from the kernel's name and
#: module), made from another definition: the op is redefined, its calls now run this kernel.
REDEFINED = "redefining the op of this name that it held, made from another definition"


@dataclasses.dataclass
class PnexReport:
    """What one ``%%pnex`` cell built, for display and for code (``-o VAR``).

    Attributes
    ----------
    kernel : KernelReport
        Schema, signature, launch configuration, PTX and resources (also reachable
        directly: ``report.registers`` is ``report.kernel.registers``).
    op : PnexOp
        The operator the cell defined.
    bound_name : str
        The name the op (with ``--jax``, its JAX function) was bound to in the notebook.
    previous : str
        What that name held before ("" if it was free).
    also_bound : tuple of str
        Other names the cell defined and bound (constants, device functions).
    timing : TimingResult or None
        Correctness and timings, with ``--args`` (``None`` without).
    sass : Disassembly
        SASS of the cubin, or why there is none.
    n_threads_values : tuple of int or None
        ``n_threads`` evaluated for ``--args``.
    compile_log : str
        Everything the compilers printed while the cell compiled.
    skipped : tuple of str
        Other annotated functions in the cell that were not compiled (see ``--name``).
    """

    kernel: KernelReport
    op: Any
    bound_name: str
    previous: str = ""
    also_bound: tuple[str, ...] = ()
    timing: TimingResult | None = None
    sass: Disassembly = dataclasses.field(default_factory=lambda: Disassembly(None, None, "not requested"))
    n_threads_values: tuple[int, ...] | None = None
    compile_log: str = ""
    skipped: tuple[str, ...] = ()
    backward_of: str | None = None
    eager_text: str | None = None
    args_text: str | None = None
    not_compiled: str = ""
    jax: bool = False  #: the name holds the op's JAX function (``%%pnex --jax``)
    sanitizer: Any = None  #: ``%%pnex --sanitize``: the SanitizerReport (pnex_magic.sanitize)

    def __getattr__(self, name: str) -> Any:
        # Convenience: report.registers, report.ptx, ... read the KernelReport.
        if name.startswith("_") or name == "kernel":
            raise AttributeError(name)
        try:
            return getattr(self.kernel, name)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") from None

    @property
    def spec(self):
        return self.op._pnex.spec

    @property
    def simulated(self) -> bool:
        """Whether the op ran (or, with no GPU here, runs) in the CUDA simulator."""
        return self.kernel.stand_in or (self.timing is not None and self.timing.device.startswith("cpu"))

    # ------------------------------------------------------------------ text

    def binding_text(self) -> str:
        what = f"{self.bound_name} = {self._bound_value()}"
        return f"bound {what} ({self._previous_text()})"

    def _previous_text(self) -> str:
        if not self.previous:
            return "a new name"
        return self.previous if self.previous in (SAME_OP, REDEFINED) else f"replacing {self.previous}"

    def _bound_value(self) -> str:
        return f"jax_op({self.kernel.op_name})" if self.jax else self.kernel.op_name

    @classmethod
    def from_kernel(cls, kernel: KernelReport, op: Any, bound_name: str, **binding: Any) -> PnexReport:
        """The report of a cell from the core's report of its kernel (its run on the
        example arguments included) and what the cell bound."""
        return cls(
            kernel=kernel, op=op, bound_name=bound_name, timing=kernel.timing, sass=kernel.sass,
            n_threads_values=kernel.n_threads_values, not_compiled=kernel.not_compiled, **binding,
        )

    def lines(self) -> list[str]:
        k = self.kernel
        # The cell's own fields (timing may be replaced) are printed below, in the cell's words.
        static = dataclasses.replace(
            k, timing=None, sass=Disassembly(None, None, "not requested"), n_threads_values=None, not_compiled="",
            efficiency=None, compute=None, profile=None,
        )
        out = list(static.lines())
        out.insert(1, f"  bound     : {self.binding_text().removeprefix('bound ')}")
        if self.also_bound:
            out.insert(2, f"  also bound: {', '.join(self.also_bound)}")
        if self.backward_of:
            out.insert(2, f"  backward  : attached as the backward of {self.backward_of}")
        if getattr(self.op, "backward_source", None):
            out.insert(2, f"  backward  : {_backward_text(self.op)} (its source: .op.backward_source)")
        if self.not_compiled:
            out.append(f"  compiled  : no ({self.not_compiled})")
        if self.n_threads_values is not None:
            out.append(f"  n_threads : {self.n_threads_values} for --args {self.args_text or ''}".rstrip())
        out.append(f"  sass      : {sass_summary(self.sass) if self.sass else sass_reason(k, self.sass)}")
        if self.skipped:
            out.append(f"  skipped   : {', '.join(self.skipped)} (annotated too; compile one with --name)")
        if self.timing is not None:
            out += ["  " + line for line in self.timing.lines(self._unit())]
        else:
            out.append("  timing    : give --args (and --eager) to check correctness and time the op")
        if k.efficiency is not None:
            out += ["  " + line for line in k.efficiency.lines()]
        for part in (k.compute, k.profile):  # the FLOP count and rate; --profile's figures
            if part is not None:
                out += ["  " + line for line in part.lines()]
        return out

    def _unit(self) -> tuple[float, str]:
        """One unit for every rate the report shows."""
        e = self.kernel.efficiency
        if e is not None:
            return e.unit
        t = self.timing
        return rate_unit(t.bandwidth, t.eager_bandwidth) if t is not None else rate_unit()

    def to_text(self) -> str:
        return "\n".join(self.lines())

    def summary(self) -> str:
        """A compact plain-text summary: the kernel, its signature, the launch, the
        registers and occupancy, and the correctness and timing verdicts (what an
        untrusted notebook shows)."""
        return summary_text(self)

    __str__ = to_text

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("PnexReport(...)" if cycle else self.to_text())

    # ------------------------------------------------------------------ HTML sections

    def header_html(self) -> str:
        k = self.kernel
        how = "cache hit" if k.cache_hit else f"compiled in {k.compile_seconds:.2f} s"
        if self.not_compiled:
            how = "not compiled"
        badges = []
        if k.spills:
            badges.append(badge("SPILLS", ERR))
        if self.timing is not None and self.timing.correctness is not None:
            c = self.timing.correctness
            badges.append(badge("matches eager" if c.ok else "DIFFERS from eager", OK if c.ok else ERR))
        if self.timing is not None and self.timing.speedup is not None:
            badges.append(badge(f"{self.timing.speedup:.2f}× vs eager", speed_colour(self.timing.speedup)))
        e = k.efficiency
        if e is not None and (e.at_ceiling or e.near or e.far):
            share = "launch-bound" if e.launch_bound else f"{share_text(e.op_of_ceiling)} of the ceiling"
            badges.append(badge(share, OK if e.at_ceiling else WARN if e.far else FG_MUTED))
        if self.simulated:
            badges.append(badge("CUDA simulator", readable(ACCENT)))
        if k.autotune is not None and k.autotune.timed:
            badges.append(badge(f"autotuned: {k.autotune.candidates[k.autotune.choice].label()}", ACCENT))
        prev = f" ({escape(self._previous_text())})"
        arch = f"{k.arch} (stand-in target)" if k.stand_in else k.arch
        lines = [
            f'<div style="margin:2px 0"><b>{code(self.bound_name)}</b> = {code(self._bound_value())}{prev} '
            f'&middot; {escape(arch)} &middot; {escape(how)} {" ".join(badges)}</div>'
        ]
        if k.stand_in:
            lines.append(note(escape(f"No GPU here: the op runs in numba-cuda's CUDA simulator (on CPU tensors), and "
                                     f"the PTX, SASS, registers and occupancy shown are those of {k.arch}, a stand-in "
                                     f"compile target (--arch picks another).")))
        extra = []
        if self.also_bound:
            extra.append("also bound: " + ", ".join(code(n) for n in self.also_bound))
        if self.backward_of:
            extra.append(f"attached as the backward of {code(self.backward_of)}")
        if self.skipped:
            extra.append("not compiled: " + ", ".join(code(n) for n in self.skipped) + " (pick with --name)")
        if extra:
            lines.append(note(" &middot; ".join(extra)))
        return "".join(lines)

    def signature_html(self) -> str:
        k = self.kernel
        spec = self.spec
        outs = spec.outputs
        if not outs:
            mutated = ", ".join(spec.mutated)
            returns = "nothing (None)" + (f"; it writes {code(mutated)} in place" if mutated else "")
        elif len(outs) == 1:
            returns = f"one tensor, {code(outs[0].name)}: {code(outs[0].describe())}"
        else:
            returns = f"a tuple of {len(outs)} tensors: " + ", ".join(code(o.name) for o in outs)
        rows = []
        for p in spec.params:
            role = {"in": "argument", "inmut": "argument, written in place", "out": "returned",
                    "scalar": "argument", "unused": "dropped (passed None)",
                    "tune": "a compile-time constant the autotuner chooses (not an argument)",
                    "seed": "pnex.random's seed, drawn per call from torch's generator (not an argument)"}[p.role]
            annotation = p.describe()
            if isinstance(p, ScalarParam):  # as the signature above spells it, with its dtype
                annotation = p.dtype.python_type.__name__ + (f" = {p.default_text()}" if p.has_default else "")
                role = f"argument, a {p.dtype.name} scalar"
            rows.append((code(p.name), code(annotation), escape(role)))
        args = ", ".join(p.name for p in spec.arguments)
        torch_call = "torch.ops." + k.op_name.replace("::", ".") + f"({args})"
        parts = [
            "<div><b>Python signature</b></div>",
            pre(highlight(k.signature, python_lexer())),
            f"<div>returns {returns}</div>",
            '<div style="margin-top:6px"><b>torch schema</b></div>',
            pre(escape(k.schema)),
            note(f"call it as {code(f'{self.bound_name}({args})')} on jax.Arrays (under jax.jit too), and the "
                 f"PyTorch op as {code(f'{self.bound_name}.op({args})')} or {code(torch_call)}" if self.jax else
                 f"call it as {code(f'{self.bound_name}({args})')} or "
                 f"{code(torch_call)}; it works under "
                 f"torch.compile(fullgraph=True)"),
            table(rows, ("parameter", "annotation", "role")),
        ]
        if spec.requires:  # jit(requires=...): every launcher refuses a call that breaks one
            parts.append(note("a call must keep " + "; ".join(code(r.text) for r in spec.requires)
                              + " (else ArgumentValueError, before the kernel runs)"))
        static = [r for r in spec.tune_rules if r not in spec.call_tune_rules]
        if static:  # jit(tune_requires=...): the combinations of Tune choices kept
            every = math.prod(len(p.choices) for p in spec.tune_params)
            parts.append(note(f"Tune combinations kept: {len(spec.tune_variants)} of {every}, by "
                              + "; ".join(code(r.text) for r in static)))
        if spec.call_tune_rules:  # tune_requires naming the call's arguments
            parts.append(note("each call launches only the Tune combinations that keep "
                              + "; ".join(code(r.text) for r in spec.call_tune_rules)
                              + " for its sizes (a call that keeps none: ArgumentValueError)"))
        if k.source:
            parts.append(
                f'<details><summary style="cursor:pointer">kernel source</summary>'
                f"{pre(highlight(k.source, python_lexer()), max_height='24em')}</details>"
            )
        parts.append(backward_html(self.op))
        return "".join(parts)

    def launch_html(self) -> str:
        k = self.kernel
        axes = "XYZ"
        rows = []
        shape = k.autotune.block if k.autotune is not None else k.threads_per_block
        for i, expr in enumerate(k.n_threads):
            value = "" if self.n_threads_values is None else str(self.n_threads_values[i])
            tpb = shape[i]
            blocks = "" if k.grid is None else str(k.grid[i])
            rows.append((axes[i], code(expr), escape(value), str(tpb), escape(blocks)))
        header = ("axis", "n_threads", "value for --args", "threads per block", "blocks")
        parts = [table(rows, header)]
        block_total = math.prod(shape)
        axes_used = [str(n) for n in shape]
        per_axis = f" ({' × '.join(axes_used)})" if len(axes_used) > 1 else ""
        parts.append(f"<div>{block_total} threads per block{per_axis}</div>")
        if k.dynamic_shared_bytes:
            parts.append(f"<div>{k.dynamic_shared_bytes:,} B of dynamic shared memory per block "
                         f"(shared_bytes = {code(k.shared_bytes_text)})</div>")
        if k.grid is not None and k.block is not None:
            blocks = k.grid[0] * k.grid[1] * k.grid[2]
            launched = blocks * block_total
            needed = 1
            for v in self.n_threads_values or ():
                needed *= v
            idle = launched - needed if self.n_threads_values else 0
            parts.append(
                f"<div>grid {code(str(k.grid))} blocks × block {code(str(k.block))} threads = "
                f"{launched:,} threads launched for {escape(self.args_text or 'the example arguments')}"
                + (f" ({idle:,} beyond n_threads, kept idle by the kernel's bounds check)" if idle > 0 else "")
                + "</div>"
            )
        else:
            parts.append(note("give --args EXPR to see the grid for concrete arguments"))
        parts.append(note("Axes are in CUDA's X, Y, Z order: cuda.grid(2) returns (x, y); blocks per "
                           "axis = ceil(n_threads / threads per block)."))
        if shows_autotune(k):
            parts.append(autotune_html(k))
        return "".join(parts)

    def ptx_html(self) -> str:
        k = self.kernel
        if not k.ptx:
            return note(escape(f"no PTX: {self.not_compiled or 'the kernel was not compiled'}"))
        entry = k.entry[:36] + ("…" if len(k.entry) > 36 else "")
        return (
            f'<div style="overflow-wrap:anywhere"><b>PTX</b> ({len(k.ptx.splitlines())} lines, {escape(k.arch)}; '
            f"entry {code(entry)})</div>"
            + listing(k.ptx, PtxLexer(), "rep.kernel.ptx")
        )

    def sass_html(self) -> str:
        """The SASS listing, the kernel's own function first, then the helpers it calls."""
        found = self.sass
        if not found:
            return note(escape(f"not shown: {sass_reason(self.kernel, found)}"))
        names = found.functions
        helpers = ""
        if len(names) > 1:
            helpers = (f"; the kernel first, then the helper function{'s' if len(names) > 2 else ''} it calls: "
                       + ", ".join(code(n) for n in names[1:]))
        return (
            f'<div style="overflow-wrap:anywhere"><b>SASS</b> ({found.line_count} lines, {escape(self.kernel.arch)}, '
            f"from {escape(found.tool)}{helpers})</div>"
            + listing(found.text, SassLexer(), "rep.sass.text")
        )

    def resources_html(self) -> str:
        k = self.kernel
        if k.registers is None:
            parts = [note(escape("no resource figures: " + (self.not_compiled or
                     "nvJitLink was not available to assemble the PTX (pip install numba-cuda[cu12] or [cu13])")))]
            return "".join(parts)
        spill_style = f"color:{ERR};font-weight:600" if k.spills else ""
        spills = (
            f'<span style="{spill_style}">{k.spill_store_bytes} B stored, {k.spill_load_bytes} B loaded</span>'
            if k.spills else "none"
        )
        cap = f" (capped at {k.max_registers} by --max-registers)" if k.max_registers else ""
        tpb = math.prod(k.autotune.block if k.autotune is not None else k.threads_per_block)
        rows = [
            ("registers per thread", f"{k.registers}{escape(cap)}"),
            ("shared memory per block (static)", f"{k.shared_bytes} B"),
            *([("shared memory per block (dynamic, shared_bytes)",
                f"{k.dynamic_shared_bytes} B = {code(k.shared_bytes_text)}")] if k.dynamic_shared_bytes else []),
            ("local memory per thread", f'<span style="{spill_style}">{k.local_bytes} B</span>'),
            ("register spills", spills),
            ("constant memory (parameters)", f"{k.const_bytes} B"),
        ]
        if k.occupancy is not None:
            bar = (
                f'<span style="display:inline-block;width:8em;height:0.7em;border:1px solid;'
                f'{themed("border-color", BORDER)};vertical-align:middle;margin-right:6px">'
                f'<span style="display:block;height:100%;width:{k.occupancy * 100:.0f}%;'
                f'{themed("background", ACCENT)}"></span></span>'
            )
            rows.append((f"theoretical occupancy ({tpb} threads/block, {escape(k.arch)})", f"{bar}{k.occupancy:.0%}"))
        parts = [table(rows)]
        if k.stand_in:
            parts.insert(0, note(escape(f"for {k.arch}, a stand-in compile target (no GPU here): on a GPU the "
                                        f"figures are those of its own architecture")))
        if k.spills:
            parts.append(
                f'<div style="color:{ERR}">The kernel spills registers to local memory, which is slow: '
                f"raise --max-registers, or use fewer live values per thread.</div>"
            )
        sizes = [s for s in (32, 64, 128, 256, 512, 1024)]
        occ = [(s, occupancy(k.arch, k.registers, k.shared_total or 0, s)) for s in sizes]
        if all(o is not None for _, o in occ):
            parts.append(note("theoretical occupancy by threads per block:"))
            parts.append(table([tuple(f"{s}" for s, _ in occ), tuple(f"{o:.0%}" for _, o in occ)]))
        if k.link_log.strip():
            parts.append(log_details_html("ptxas / nvJitLink log", k.link_log))
        if self.compile_log.strip():
            parts.append(log_details_html("compiler output", self.compile_log))
        return "".join(parts)

    def timing_html(self) -> str:
        t = self.timing
        if t is None:
            return note("Give --args EXPR (example arguments) and --eager EXPR (a PyTorch function taking the "
                         "same arguments) to check the op against eager PyTorch and, on a GPU, time both.")
        parts = [f"<div>on {escape(t.device)}</div>"]
        unit = self._unit()
        if t.op is not None:
            rows = []
            for label, m, bw in ((t.name, t.op, t.bandwidth), (t.eager_name, t.eager, t.eager_bandwidth)):
                if m is None:
                    continue
                rows.append((
                    code(label), format_time(m.median), f"{format_time(m.q1)} – {format_time(m.q3)}",
                    format_time(m.best), f"{m.repeat} × {m.loops}",
                    "" if bw is None else format_rate(bw, unit),
                ))
            parts.append(table(rows, ("", "median", "IQR", "min", "runs × loops", "bandwidth")))
            if t.speedup is not None:
                colour = speed_colour(t.speedup)
                parts.append(
                    f'<div>speed-up: <b style="color:{colour}">{t.speedup:.2f}×</b> (eager median / op median)</div>'
                )
            parts.append(note(
                f"CUDA events around back-to-back calls after warm-up; bandwidth = {format_bytes(t.bytes_moved)} "
                f"of arguments and outputs per call / median time"
            ))
        else:
            parts.append(note(escape(f"not timed: {t.reason}")))
        if self.kernel.efficiency is not None:
            parts.append(efficiency_html(self.kernel.efficiency, t.name, t.eager_name))
        if self.kernel.compute is not None:
            parts.append(compute_html(self.kernel.compute))
        if t.correctness is not None:
            parts.append(correctness_html(t.correctness))
        elif self.eager_text is None:
            parts.append(note("give --eager EXPR to check the results against PyTorch"))
        return "".join(parts)

    def sections(self) -> list[tuple[str, str]]:
        contents = (
            self.signature_html(), self.launch_html(), self.ptx_html(), self.sass_html(), self.resources_html(),
            self.timing_html(),
        )
        sections = list(zip(TAB_TITLES, contents, strict=True))
        if self.kernel.profile is not None:  # %%pnex --profile
            sections.append(("Profile", profile_html(self.kernel.profile)))
        return sections

    # ------------------------------------------------------------------ renderings

    def to_html(self) -> str:
        """The static HTML form: the sections as tabs that need no script and no widget
        state (see :func:`~pnex_magic.render.html.tabs`), so a saved, reopened or
        converted notebook shows the same report as the live one, and the compact
        :meth:`summary` where a sanitiser drops the report's ``<style>``
        (:func:`~pnex_magic.render.html.static_view`)."""
        sections = self.sections()
        rich = (f'<div style="font-weight:600">pnex kernel {code(self.kernel.name)}</div>'
                f"{self.header_html()}{tabs(sections)}")
        return static_view(self.summary(), rich, len(sections))

    def _repr_html_(self) -> str:
        return self.to_html()

    def widget(self):
        """An ipywidgets view of the report (a header above a ``Tab`` with the six
        sections), for code that composes widgets; works with ipywidgets 7 and 8.
        Notebooks display :meth:`to_html` instead: a widget view shows only while its
        kernel lives (a reopened notebook without saved widget state shows "Error
        displaying widget: model not found" in its place)."""
        import ipywidgets as w

        sections = self.sections()
        children = [w.HTML(value=_wrap(content), layout=w.Layout(width="100%")) for _title, content in sections]
        tab = w.Tab(children=children, layout=w.Layout(width="100%"))
        for i, (title, _content) in enumerate(sections):
            tab.set_title(i, title)  # ipywidgets 7 has no `titles` trait
        header = w.HTML(value=_wrap(self.header_html()), layout=w.Layout(width="100%"))
        return w.VBox([header, tab], layout=w.Layout(width="100%"))

    def _repr_mimebundle_(self, include=None, exclude=None):
        # Static forms only: every front end shows text/html without a kernel or widget
        # state (see pnex_magic/render/html.py for what each front end keeps of it).
        return {"text/plain": self.to_text(), "text/html": self.to_html()}


def speed_colour(speedup: float) -> str:
    """A speed-up's colour: green from 1.05×, the warning's at 0.95× or less, the muted
    text's between (a tie, which rounds to ``1.00×``, is no warning)."""
    return OK if speedup >= 1.05 else WARN if speedup <= 0.95 else FG_MUTED


def sass_reason(k: KernelReport, found: Disassembly) -> str:
    """Why there is no SASS: where no GPU is and no disassembler either, none is needed
    (SASS would be the stand-in target's), so nothing is asked to be installed."""
    if k.stand_in and found.tool is None and found.reason.startswith(NO_DISASSEMBLER):
        return (f"no disassembler here (cuobjdump or nvdisasm); none is needed to run kernels in the simulator, and "
                f"SASS here would be that of {k.arch}, the stand-in target")
    return found.reason


def correctness_html(c) -> str:
    """The op's results against the reference's: a pass that reads as one (every
    element within the tolerance, the largest difference against the reference's
    scale), or how many elements are outside it and the worst of them."""
    colour = OK if c.ok else ERR
    verdict = "matches eager" if c.ok else "DIFFERS from eager" if c.compared else "not compared"
    parts = [f'<div style="color:{colour};font-weight:600;margin-top:6px">{verdict}</div>']
    what = escape(", ".join(c.compared))
    tolerance = f"{c.tolerance} (torch.testing's defaults for the dtype; compared in float64)"
    difference = (f"{c.max_abs_error:.3g}, {c.scaled_error:.2g} of the largest reference value "
                  f"({c.max_reference:.3g})")
    if c.compared and c.ok and c.max_abs_error == 0:
        parts.append(table([("checked", f"all {c.elements:,} elements of {what}: identical")]))
    elif c.compared and c.ok:
        parts.append(table([
            ("checked", f"all {c.elements:,} elements of {what} within the tolerance"),
            ("largest difference", difference),
            ("tolerance", tolerance),
        ]))
    elif c.compared and c.elements:
        rows = [("outside the tolerance", f"{c.mismatched:,} of {c.elements:,} elements of {what}")]
        if c.worst is not None:
            rows.append(("worst element", escape(str(c.worst))))
        rows += [("largest difference", difference), ("tolerance", tolerance)]
        parts.append(table(rows))
    if c.note:
        parts.append(note(escape(c.note)))
    return "".join(parts)


def _backward_text(op: Any) -> str:
    """(Only for an op with a backward's source: one is attached.)"""
    backward = attached_backward(op).backward.definition
    derived = getattr(backward.fn, "pnex_derived_from", None)
    name = backward.op_name
    return f"{'derived from the kernel (--backward auto)' if derived else 'attached'}: {name}"


def backward_html(op: Any) -> str:
    """The Backward section: the source of the backward kernel attached to ``op`` (the one
    pnex derived with ``--backward auto``, or a hand-written one), when it has one."""
    source = getattr(op, "backward_source", None)
    if not source:
        return ""
    return (f'<div style="margin-top:6px"><b>Backward</b>: {escape(_backward_text(op))}</div>'
            f'<details><summary style="cursor:pointer">backward kernel source</summary>'
            f"{pre(highlight(source, python_lexer()), max_height='32em')}</details>")


def _wrap(content: str) -> str:
    # ipywidgets' HTML widget sets line-height to the height of one input row (28px);
    # reset it for multi-line content.
    return f'<div style="color:inherit;font-size:13px;line-height:1.45">{content}</div>'
