"""Sphinx extension: tables of measured results, generated from ``benchmarks/results/*.json``
when the docs are built, so that no figure in a table is typed by hand.

In a MyST page::

    ```{pnex-results} derived-backward-2026-11-26-0256.json
    :table: rows
    ```

renders the named result file's table (``:table:`` picks one when a benchmark writes
several; each kind's tables are listed in :data:`TABLES`).  Every table's caption names
the GPU (or says that the run had none), the date of the run and the file.  A file or
table that does not exist, or a file whose kind has no table here, is a build error
(with ``-W``), never an empty table.  ``{pnex-results-index}`` lists every result file, and
``{pnex-inflight-model}`` tabulates what the report's bytes-in-flight model predicts per GPU.

:func:`render` (file name, table) -> (caption, header, rows) is the whole logic and
needs no Sphinx: tests/test_docs.py checks it against the JSON directly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

Table = tuple[list[str], list[list[str]]]


# --- number formats -------------------------------------------------------------------------------

def _num(x: float, digits: int = 3) -> str:
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}" if abs(x) < 100 else f"{x:.1f}"


def us(x: float | None) -> str:
    """Microseconds, switching to ms above 1,000 µs."""
    if x is None:
        return "–"
    return f"{_num(x / 1000)} ms" if x >= 1000 else f"{_num(x)} µs"


def ms(x: float | None) -> str:
    return "–" if x is None else f"{_num(x)} ms"


def sec(x: float | None) -> str:
    if x is None:
        return "–"
    return us(x * 1e6) if x < 1e-3 else (ms(x * 1e3) if x < 0.1 else f"{_num(x)} s")


def ratio(x: float | None) -> str:
    """``1.23×``; three decimals where two would print ``1.00×`` for a ratio that is not 1
    (``0.998×``: a "1.00×" beside a goal of "faster" hides which side it falls on)."""
    if x is None:
        return "–"
    if f"{x:.2f}" == "1.00" and x != 1.0:
        return f"{x:.3f}×"
    return f"{x:.2f}×"


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def yes(x: Any) -> str:
    return "–" if x is None else ("yes" if x else "no")


def _block(b: Any) -> str:
    if isinstance(b, (list, tuple)):
        return "(" + ", ".join(str(v) for v in b) + ")" if len(b) > 1 else str(b[0])
    return "–" if b is None else str(b)


# --- one builder per table --------------------------------------------------------------------------

def _overhead_per_call(d: dict) -> Table:
    rows = [[r["route"], us(r["us_per_call"]), sec(r.get("first_use_s")), r.get("note") or ""] for r in d["per_call"]]
    return ["route", "per call", "first use", "note"], rows


def _overhead_device_time(d: dict) -> Table:
    rows = [[r["workload"], ms(r["pnex_ms"]), ms(r["handwritten_ms"]), ratio(r["ratio_hand_over_pnex"])]
            for r in d["device_time"]]
    return ["workload", "pnex", "hand-written CUDA C++", "hand-written time / pnex time"], rows


def _signatures(d: dict) -> Table:
    rows = [[s["signature"], s["native"], us(s["pnex_us"]), us(s.get("torch_ops_us")), us(s.get("cpp_entry_us")),
             us(s["native_us"]), ratio(s["ratio"]), f'{s["rounds_within_goal"]} of {len(s["round_ratios"])}']
            for s in d["signatures"]]
    return ["signature", "native op", "pnex op object", "through torch.ops", "its C++ entry", "native",
            f"pnex / native (goal ≤ {d['goal']}×)", "rounds within the goal"], rows


def _signatures_lltm(d: dict) -> Table:
    lltm = d["lltm"]
    rows = [[r["variant"], us(r["us"]), r.get("note") or ""] for r in lltm["rows"]]
    return [f"LLTM {lltm['size']}, {lltm['unit']}", "time (minimum of the rounds' medians)", "note"], rows


def _first_use(d: dict) -> Table:
    rows = [[r["row"], sec(r["min_s"]), sec(r["median_s"]), sec(r.get("goal_s"))] for r in d["rows"]]
    return ["first use, fresh process", "minimum", "median", "goal"], rows


_FRESH = {
    "first_cell_report_s": "first %%pnex cell (new kernel, --args) to its report",
    "demo_s": "python -m pnex_magic",
    "torch_import_s": "import torch (bare process)",
    "torch_compile_first_s": "first torch.compile (bare process)",
    "demo_work_s": "the demo's own work (start to return)",
    "demo_exit_s": "the demo's exit",
    "baseline_exit_s": "the bare process's exit",
    "demo_over_baseline_s": "demo over import torch + first compile",
    "launcher_ready_s": "C++ launcher serving after the first definition",
    "build_s": "its build",
    "jax_first_call_s": "a new kernel's first jax.jit call",
    "jax_after_handler_s": "the same once the XLA handler is built",
}


def _fresh_env(d: dict) -> Table:
    rows = [[label, sec(d[key]), sec(d.get(f"{key}_median")), sec(d["goals"].get(key))]
            for key, label in _FRESH.items() if key in d]
    for when in ("before", "after"):
        for sig, r in (d.get(f"per_call_us_{when}") or {}).items():
            label = "driver launcher, before the switch" if when == "before" else "C++ launcher, after the switch"
            rows.append([f"per call, {sig}, {label}", f"{us(r['pnex_us'])} (native {us(r['native_us'])})",
                         ratio(r["ratio"]) + " of native", "–" if when == "before" else f"≤ {d['goals'].get('per_call_ratio_after')}×"])
    return ["fresh environment", f"minimum of {d.get('rounds', 1)} round(s)", "median", "goal"], rows


def _tune(d: dict) -> Table:
    rows = []
    for t in d["tune"]:
        if "clone_us" in t:
            ref, plain, share = f'torch.clone {us(t["clone_us"])}', us(t.get("naive_us")), pct(t.get("tuned_of_clone"))
        else:
            ref, plain, share = f'torch.compile {us(t["compiled_us"])}', us(t.get("fixed_us")), ratio(t.get("tuned_vs_compiled"))
        rows.append([t["workload"], ref, plain, us(t["tuned_us"]), share, t.get("choice", "–"), sec(t.get("tuning_s")),
                     us(t.get("floor_us"))])
    return ["workload", "PyTorch", "one element per thread (copy) / fixed 4 points (k-means)", "Tune (chosen)",
            "of clone's bandwidth / × compile's time", "choice", "tuning time", "memory floor"], rows


def _autotune_blocks(d: dict) -> Table:
    rows = [[w["workload"], _block(w["default_block"]), us(w["default_us"]), _block(w["chosen_block"]),
             us(w["tuned_us"]), ratio(w["speedup"]), pct(w.get("tuned_of_copy"))] for w in d["workloads"]]
    return ["workload", "default block", "time", "chosen block", "time", "speed-up", "of the copy ceiling"], rows


def _checked(d: dict) -> Table:
    rows = []
    for r in d["rows"]:
        sites = "–" if r.get("checked_sites") is None else f'{r["checked_sites"]} / {r.get("proven_sites")}'
        dev = r.get("device_seconds")
        rows.append([r["workload"], r["variant"] + (" + line info" if r.get("lineinfo") else ""), str(r["registers"]),
                     str(r["sass_instructions"]), sites, yes(r.get("same_sass_as_fast")),
                     "–" if dev is None else us(dev * 1e6)])
    return ["workload", "variant", "registers", "SASS instructions", "accesses tested / proven",
            "SASS = fast", "device time"], rows


def _checked_ratios(d: dict) -> Table:
    rows = [[k, ratio(v)] for k, v in d["ratios"].items()]
    return [f"workload (goal ≤ {d['goal_ratio']}×)", "checked / fast device time"], rows


def _workloads(d: dict) -> Table:
    rows = []
    for w in d["workloads"]:
        for r in w["rows"]:
            rows.append([f'{w["name"]} ({w["size"]}, {w["unit"]})', r["variant"], us(r.get("us")),
                         r.get("check") or "", r.get("note") or ""])
    return ["workload", "variant", "time (minimum of the rounds' medians)", "check", "note"], rows


def _derived(d: dict) -> Table:
    rows = []
    for r in d["rows"]:
        s = r["seconds"]
        of = r.get("ratio_of") or ["", ""]
        rows.append([r["workload"], r["size"], us(s["forward"] * 1e6), us((s.get("hand-written backward") or 0) * 1e6)
                     if s.get("hand-written backward") else "–", us(s["derived backward"] * 1e6),
                     f'{ratio(r["ratio"])} {of[1] if len(of) > 1 else ""}'.strip(),
                     "–" if r.get("goal") is None else f'{r["goal"]}×', yes(r.get("met"))])
    return ["kernel", "size", "forward", "hand-written backward", "derived backward", "ratio (derived / …)",
            "goal", "met"], rows


def _derived_static(d: dict) -> Table:
    rows = [[k, str(v["registers"]), str(v["sass_instructions"]), str(v["atomics"]),
             ", ".join(v["zero_filled_outputs"]) or "–"] for k, v in d["static"].items()]
    return [f"kernel (float32, {d['arch']})", "registers", "SASS instructions", "atomics", "zero-filled gradients"], rows


def _doc_examples(d: dict) -> Table:
    rows = [[p["port"], yes(p["works"]), p.get("outcome", ""), us(p.get("pnex_us")), us(p.get("torch_us")),
             ratio(p.get("ratio"))] for p in d["ports"]]
    return ["port", "works", "outcome", "pnex", "PyTorch equivalent", "pnex time / PyTorch time"], rows


def _jax_diffusion(d: dict) -> Table:
    rows = [[r["route"], us(r["us_per_step"]), f'{r["relative_error"]:.1e}' if r.get("relative_error") is not None else "–"]
            for r in d["diffusion"]["rows"]]
    return [f'diffusion {d["diffusion"]["size"]}², route', "per step", "error vs float64"], rows


def _jax_hlo(d: dict) -> Table:
    rows = [[r["loop"], str(r["copies_in_while_body"]), str(r["copies_elsewhere"]), str(r["conditionals"]),
             str(r["custom_calls"])] for r in d["stencil_hlo"]["rows"]]
    return ["stencil loop", "copies in the while body", "copies elsewhere", "conditionals", "custom calls"], rows


def _jax_per_call(d: dict) -> Table:
    rows = [[r["route"], us(r["us_pipelined"]), us(r["us_synced"])] for r in d["per_call"]]
    return ["route (1024 float32)", "per call, pipelined", "per call, synced"], rows


def _jax_muladd(d: dict) -> Table:
    m = d["muladd_1gib"]
    rows = [["pnex kernel in JAX", ms(m["jax_pnex_ms"])], ["XLA's fused a*b+c", ms(m["jax_xla_fused_ms"])],
            ["the PyTorch op", ms(m["torch_op_ms"])], ["JAX / PyTorch", ratio(m["jax_vs_torch"])],
            ["JAX / XLA", ratio(m["jax_vs_xla"])]]
    if m.get("jax_pnex_donated_inmut_ms") is not None:
        rows.insert(1, ["pnex in JAX, c += a*b into a donated buffer", ms(m["jax_pnex_donated_inmut_ms"])])
    return ["1 GiB a*b+c, 10 calls back to back", "per call"], rows


def _jax_first_use(d: dict) -> Table:
    rows = [[k.replace("_", " "), sec(v.get("define_s")), sec(v.get("jax_first_call_s")), sec(v.get("total_s")),
             str(v.get("compiled_variants_added_by_jax"))] for k, v in d["first_use"].items() if isinstance(v, dict)]
    return ["first use in JAX", "definition", "first jax.jit call", "total", "variants compiled for JAX"], rows


def _export(d: dict) -> Table:
    s, lo, pc, dt = d["save"], d["load"], d["per_call"], d["device_time"]
    rows = [["save, six architectures × two layouts", sec(s["save_six_archs_s"])],
            ["import pnex_magic + pnex.load in a fresh process", sec(lo["usable_s"])],
            ["of which import pnex_magic", sec(lo["import_s"])],
            ["first call of the loaded op", sec(lo["first_call_s"])],
            ["first call, PTX linked by nvJitLink (no cubin for the GPU)", sec(lo.get("ptx_nvjitlink_first_call_s"))],
            ["per call, loaded op", us(pc["loaded_us"])], ["per call, the op that was saved", us(pc["defined_us"])],
            ["per call, torch.clone", us(pc["clone_us"])],
            ["1 GiB a*b+c device time, loaded", sec(dt["loaded_s"])], ["the same, defined", sec(dt["defined_s"])]]
    return ["export_check", "time"], rows


def _grid_random_philox(d: dict) -> Table:
    rows = [[k, us(v)] for k, v in d["philox"].items()]
    return ["2^26 numbers: generator", "device time"], rows


def _grid_random_sync(d: dict) -> Table:
    g = d["grid_sync"]
    rows = [["Laplace port, 10,000 steps (one kernel, grid sync per step)", ms(g["laplace_10000_steps_ms"])],
            ["the same steps in eager PyTorch", ms(g["torch_10000_steps_ms"])]]
    for how in ("cooperative", "plain"):
        rows.append([f"65,536 elements, launched {how}: host per call (median)", us(g["launch_host_us"][how]["median"])])
        rows.append([f"65,536 elements, launched {how}: queued on the GPU", us(g["launch_device_us"][how])])
    return ["grid-wide sync", "time"], rows


def _grid_random_seed(d: dict) -> Table:
    s = d["seed"]
    rows = [[k, us(s["host_us"][k]["median"]), us(s["queued_device_us"][k]), us(s["graph_device_us"][k])]
            for k in s["host_us"]]
    return ["seed of an all-scalar op", "host per call (median)", "queued on the GPU", "replayed in a CUDA graph"], rows


def _driver_overhead(d: dict) -> Table:
    rows = [[k, us(v["us"])] for k, v in d["rows"].items()]
    return [f"1-D copy through the driver launcher ({d.get('launcher', '')})", "per call"], rows


def _launcher_build(d: dict) -> Table:
    rows = [[r["launcher"], str(r.get("round", "")), str(r.get("max_jobs") or "default"), sec(r["seconds"]),
             sec(r.get("cpu_seconds"))] for r in d["rows"]]
    return [f"launcher build ({d['cpus']} cores, {d['compiler']}, torch {d['torch']})", "round", "jobs",
            "wall time", "CPU time"], rows


def _cuda12(d: dict) -> Table:
    rows = [[c["check"], str(c["result"]), yes(c["ok"])] for c in d["checks"]]
    return [f"CUDA 12 toolchain (nvJitLink {d['toolchain'].get('nvJitLink')}, numba-cuda {d['toolchain'].get('numba-cuda')})",
            "result", "ok"], rows


def tflops(x: float | None) -> str:
    return "–" if x is None else _num(x)


def _fastest(r: dict) -> str:
    """The fastest pnex variant, and how many of the others were not timed (failed or wrong)."""
    failed = sum(1 for v in (r.get("pnex_variants") or {}).values() if v.get("tflops") is None)
    return (r.get("pnex_kernel") or "–") + (f" ({failed} of {len(r['pnex_variants'])} variants not timed)"
                                             if failed else "")


def _tc_gemm(d: dict) -> Table:
    rows = [[r["dtype"], str(r["m"]), str(r["n"]), str(r["k"]), tflops(r["pnex_tflops"]), tflops(r["cublas_tflops"]),
             tflops(r.get("triton_tflops")), ratio(r.get("ratio_vs_cublas")), _fastest(r)] for r in d["gemm"]]
    return ["dtype", "M", "N", "K", "pnex (TFLOP/s)", "cuBLAS (TFLOP/s)", "Triton (TFLOP/s)", "pnex / cuBLAS",
            "pnex kernel (the fastest variant)"], rows


def _tc_attention(d: dict) -> Table:
    rows = [[str(r["batch"]), str(r["seq"]), str(r["heads"]), str(r["head_dim"]), yes(r["causal"]),
             tflops(r["pnex_tflops"]), tflops(r["sdpa_tflops"]), ratio(r.get("ratio_vs_sdpa")), _fastest(r)]
            for r in d["attention"]]
    return ["batch", "seq", "heads", "head_dim", "causal", "pnex (TFLOP/s)", "SDPA flash (TFLOP/s)", "pnex / SDPA",
            "pnex kernel"], rows


_OPTIONAL_EPILOGUE_COLUMNS = (("pnex_tma_cluster_us", "pnex, fused (TMA, 2-block clusters)"),
                              ("pnex_tma_persistent_us", "pnex, fused (TMA, persistent)"),
                              ("pnex_pingpong_us", "pnex, fused (ping-pong 128×128)"),
                              ("pnex_pingpong_64x256_us", "pnex, fused (ping-pong 64×256)"),
                              ("pnex_pingpong_cluster_us", "pnex, fused (ping-pong, 2-block clusters)"))


def _tc_epilogue(d: dict) -> Table:
    """Fused bias + GELU; files from before the TMA kernel had one (cp.async) pnex kernel,
    and the clustered and persistent TMA and the ping-pong kernels' columns appear where a file has them."""
    extra = [(key, title) for key, title in _OPTIONAL_EPILOGUE_COLUMNS if any(r.get(key) for r in d["epilogue"])]
    rows = [[str(r["m"]), str(r["n"]), str(r["k"]), us(r["pnex_us"]) if r.get("pnex_us") else "–",
             us(r["pnex_tma_us"]) if r.get("pnex_tma_us") else "–",
             *[us(r[key]) if r.get(key) else "–" for key, _ in extra], us(r["eager_us"]), us(r["compile_us"]),
             ratio(r["pnex_vs_eager"]) if r.get("pnex_vs_eager") else "–",
             ratio(r["pnex_vs_compile"]) if r.get("pnex_vs_compile") else "–"] for r in d["epilogue"]]
    return ["M", "N", "K", "pnex, fused (cp.async)", "pnex, fused (TMA)", *[title for _, title in extra], "eager",
            "torch.compile", "eager time / fastest pnex time", "torch.compile time / fastest pnex time"], rows


def _epilogue_pairs(d: dict) -> Table:
    """``benchmarks/epilogue_pairs.py``: every contender's median over interleaved rounds, its
    quartiles, and where the file has it the median within-round cost over its own product
    (the contender's ``product`` and ``over_product_us``; files written before 2026-11-29
    09:00 have the row's ``<fused>_over_<product>_us`` keys instead)."""
    rows = []
    for r in d["rows"]:
        shape = f'{r["m"]}×{r["n"]}×{r["k"]}'
        for name, c in r["contenders"].items():
            if "us" not in c:
                rows.append([shape, name, "–", "–", "–", c.get("note", "not timed")])
                continue
            if "product" in c:
                cost = f'+{us(c["over_product_us"])} over {c["product"]}'
            else:
                over = [key for key in r if key.startswith(f"{name}_over_") and key.endswith("_us")]
                cost = f'+{us(r[over[0]])} over {over[0][len(name) + 6:-3]}' if over else "–"
            rows.append([shape, name, us(c["us"]), f'{c["us_q1"]:.1f}–{c["us_q3"]:.1f}', cost,
                         f'{ratio(r["contenders"]["eager"]["us"] / c["us"])}' if "us" in r["contenders"].get(
                             "eager", {}) else "–"])
    return ["M×N×K", "contender", "median", "quartiles (µs)", "paired cost over its product",
            "eager time / this time"], rows


def _stall(stalls: list) -> str:
    return f"{stalls[0][0]} ({pct(stalls[0][1])})" if stalls else "–"


def _tc_profiles(d: dict) -> Table:
    rows = []
    for r in d["profiles"]:
        if r.get("error"):
            rows.append([r["kernel"], "–", "–", "–", "–", "–", "not profiled: " + r["error"]])
            continue
        rows.append([r["kernel"], pct(r.get("tensor_pipe")), pct(r.get("compute_sol")), pct(r.get("memory_sol")),
                     pct(r.get("dram_sol")), pct(r.get("achieved_occupancy")), _stall(r.get("stalls") or [])])
    return ["kernel (Nsight Compute, one launch)", "tensor pipe", "compute (SM)", "memory", "DRAM",
            "achieved occupancy", "top stall reason (share of samples)"], rows


def _profile_check(d: dict) -> Table:
    rows = []
    for r in d["profiles"]:
        hot = r["hot_lines"][0] if r.get("hot_lines") else None
        rows.append([r["kernel"], us(r["duration_us"]), pct(r["memory_sol"]), pct(r["compute_sol"]),
                     f'{pct(r["achieved_occupancy"])} of {pct(r["theoretical_occupancy"])}', _stall(r["stalls"]),
                     f"line {hot[0]}: {hot[3]} ({pct(hot[1])})" if hot else "–", sec(r["profile_seconds"])])
    return [f"kernel, 2^{int(d['n']).bit_length() - 1} elements", "one launch", "memory (speed of light)",
            "compute (speed of light)", "achieved occupancy", "top stall reason", "hottest line",
            "time to profile"], rows


def _profile_roofline(d: dict) -> Table:
    r = d["roofline"]
    rows = [["SM clock (maximum)", f'{_num(r["sm_clock_mhz"])} MHz'],
            ["FP16/BF16 tensor-core peak, pnex's figure", f'{tflops(r["fp16_tc_peak_tflops"])} TFLOP/s'],
            ["torch.matmul, bfloat16, 8192 × 8192 × 8192", f'{tflops(r["bf16_matmul_tflops"])} TFLOP/s'],
            ["its share of that peak", pct(r["matmul_share_of_peak"])],
            ["naive pnex matmul (float32, flops=), the report's rate", f'{tflops(r["naive_mm_tflops"])} TFLOP/s'],
            ["its share of its peak", pct(r["naive_mm_share"])],
            ["its peak", r["naive_mm_peak"] or "–"],
            ["its bound, by the ridge point", r["naive_mm_bound"] or "–"]]
    return ["compute roofline", "value"], rows


#: benchmark kind -> {table name: builder}; the first table is the default.
TABLES: dict[str, dict[str, Callable[[dict], Table]]] = {
    "overhead": {"per_call": _overhead_per_call, "device_time": _overhead_device_time},
    "overhead-signatures": {"signatures": _signatures, "lltm": _signatures_lltm},
    "first-use": {"rows": _first_use},
    "fresh-env": {"summary": _fresh_env},
    "autotune": {"tune": _tune, "blocks": _autotune_blocks},
    "checked-overhead": {"rows": _checked, "ratios": _checked_ratios},
    "workloads": {"workloads": _workloads},
    "derived-backward": {"rows": _derived},
    "derived-backward-compile-only": {"static": _derived_static},
    "doc-examples": {"ports": _doc_examples},
    "jax-overhead": {"diffusion": _jax_diffusion, "stencil_hlo": _jax_hlo, "per_call": _jax_per_call,
                     "muladd_1gib": _jax_muladd, "first_use": _jax_first_use},
    "export": {"summary": _export},
    "grid-random": {"philox": _grid_random_philox, "grid_sync": _grid_random_sync, "seed": _grid_random_seed},
    "driver-overhead": {"rows": _driver_overhead},
    "launcher-build": {"rows": _launcher_build},
    "cuda12-check": {"checks": _cuda12},
    "tensor-cores": {"gemm": _tc_gemm, "attention": _tc_attention, "epilogue": _tc_epilogue,
                     "profiles": _tc_profiles},
    "profile-check": {"profiles": _profile_check, "roofline": _profile_roofline},
    "epilogue-pairs": {"rows": _epilogue_pairs},
}


def kind(name: str) -> str:
    """The benchmark kind of a result file, from its name (``derived-backward-2026-...json``)."""
    stem = re.sub(r"-cpu$", "", re.split(r"-\d{4}-\d{2}-\d{2}", Path(name).stem)[0])
    return {"fresh-env-cu12": "fresh-env"}.get(stem, stem)


def load(name: str) -> dict:
    path = RESULTS / name
    if not path.is_file():
        raise ValueError(f"no result file benchmarks/results/{name}")
    return json.loads(path.read_text())


def when(name: str, d: dict) -> str:
    """The run's date and time (UTC), from the file or, where it has none, from its name."""
    date = d.get("date")
    if isinstance(date, str):
        m = re.match(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2})", date)
        if m:
            return f"{m.group(1)} {m.group(2)} UTC"
    m = re.search(r"(\d{4}-\d{2}-\d{2})(?:-(\d{2})(\d{2}))?", name)
    if not m:
        raise ValueError(f"{name}: no date in the file or its name")
    return m.group(1) + (f" {m.group(2)}:{m.group(3)} UTC" if m.group(2) else "")


def device(d: dict) -> str:
    """The GPU of the run, or what ran instead."""
    gpu = d.get("gpu")
    if isinstance(gpu, dict) and (gpu.get("name") or gpu.get("gpu")):
        g = gpu.get("name") or gpu.get("gpu")
        driver = gpu.get("driver") or (f"CUDA {gpu['driver_cuda']}" if gpu.get("driver_cuda") else None)
        return f"{g}" + (f" (driver {driver})" if driver else "")
    if isinstance(gpu, str) and gpu:
        info = d.get("gpu_info") if isinstance(d.get("gpu_info"), dict) else {}
        return gpu + (f" (driver {info['driver']})" if info.get("driver") else "")
    arch = d.get("arch")
    cpus = d.get("cpus")
    return "no GPU: a CPU machine" + (f" of {cpus} cores" if cpus else "") + (f", compiled for {arch}" if arch else "")


def versions(d: dict) -> str:
    v = d.get("versions") or {}
    parts = [f"{k} {v[k]}" for k in ("torch", "numba-cuda") if v.get(k)]
    if not parts and d.get("torch"):
        parts = [f"torch {d['torch']}"]
    return ", ".join(parts)


def render(name: str, table: str | None = None) -> tuple[str, list[str], list[list[str]]]:
    """(caption, header, rows) of a result file's table."""
    d = load(name)
    k = kind(name)
    if k not in TABLES:
        raise ValueError(f"{name}: no table is defined for results of kind {k!r} (docs/_ext/pnex_results.py)")
    tables = TABLES[k]
    table = table or next(iter(tables))
    if table not in tables:
        raise ValueError(f"{name}: kind {k!r} has the tables {sorted(tables)}, not {table!r}")
    try:
        header, rows = tables[table](d)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{name}: table {table!r} cannot be made from this file ({type(exc).__name__}: {exc})") from exc
    v = versions(d)
    caption = f"{device(d)}, {when(name, d)}: benchmarks/results/{name}" + (f" ({v})" if v else "")
    return caption, header, rows


def index_rows() -> list[list[str]]:
    rows = []
    for path in sorted(RESULTS.glob("*.json")):
        d = json.loads(path.read_text())
        k = kind(path.name)
        try:
            date = when(path.name, d)
        except ValueError:
            date = "–"
        rows.append([path.name, k, device(d), date, ", ".join(TABLES.get(k, {})) or "–"])
    return rows


# --- docutils ---------------------------------------------------------------------------------------

def _table(caption: str | None, header: list[str], rows: list[list[str]], classes: list[str]) -> nodes.table:
    table = nodes.table(classes=["pnex-results", *classes])
    if caption:
        table += nodes.title(text=caption)
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)

    def row(cells: list[str]) -> nodes.row:
        r = nodes.row()
        for c in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=c)
            r += entry
        return r

    head = nodes.thead()
    head += row(header)
    group += head
    body = nodes.tbody()
    for cells in rows:
        if len(cells) != len(header):
            raise ValueError(f"row {cells} has {len(cells)} cells for {len(header)} columns")
        body += row(cells)
    group += body
    return table


class ResultsTable(SphinxDirective):
    required_arguments = 1
    option_spec = {"table": directives.unchanged}

    def run(self):
        name = self.arguments[0]
        self.env.note_dependency(str(RESULTS / name))
        try:
            caption, header, rows = render(name, self.options.get("table"))
        except ValueError as exc:
            raise self.error(str(exc)) from None
        return [_table(caption, header, rows, ["pnex-results-table"])]


class ResultsIndex(SphinxDirective):
    def run(self):
        return [_table(None, ["file", "kind", "GPU", "date", "tables"], index_rows(), ["pnex-results-index"])]


# --- the bytes-in-flight model's predictions (computed, not measured) -------------------------------

def inflight_model() -> tuple[str, list[str], list[list[str]]]:
    """What the report's bytes-in-flight model predicts for a float32 copy in blocks of 256 on
    each recorded GPU profile: ``benchmarks/inflight_fit.py``'s ``predictions()``."""
    import importlib.util

    path = RESULTS.parent / "inflight_fit.py"
    spec = importlib.util.spec_from_file_location("_pnex_inflight_fit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = []
    for p in module.predictions():
        s = p["shares"]
        rows.append([f'{p["profile"]} ({p["arch"]})', f'{p["bytes_for_95"] / 1024:.1f} KiB', f"{s[1]:.2f}",
                     " / ".join(f"{s[k]:.2f}" for k in (2, 4, 8))])
    caption = ("model, not a measurement: pnex_magic.hardware.in_flight_share over the profiles of "
               "pnex_magic.profiles, computed when these docs were built (benchmarks/inflight_fit.py)")
    return caption, ["GPU", "bytes per SM for 95%", "one element per thread", "2 / 4 / 8 per thread"], rows


class InflightModel(SphinxDirective):
    def run(self):
        self.env.note_dependency(str(RESULTS.parent / "inflight_fit.py"))
        caption, header, rows = inflight_model()
        return [_table(caption, header, rows, ["pnex-results-table"])]


def setup(app):
    app.add_directive("pnex-results", ResultsTable)
    app.add_directive("pnex-results-index", ResultsIndex)
    app.add_directive("pnex-inflight-model", InflightModel)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
