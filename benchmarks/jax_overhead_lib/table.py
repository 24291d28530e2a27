"""The table ``benchmarks/jax_overhead.py`` prints last, from its result."""

from __future__ import annotations


from jax_overhead_lib.settings import GOALS


# ---------------------------------------------------------------------------- the table


def _goal(met) -> str:
    return "" if met is None else ("met" if met else "MISSED")


def format_table(result: dict) -> str:
    lines = [f"JAX {result['versions'].get('jax')} on {result['gpu'].get('name')} "
             f"(driver {result['gpu'].get('driver')}), {result['date']}", ""]
    d = result.get("diffusion")
    if d:
        lines.append(f"diffusion {d['size']}², {d['steps']:,} steps    µs/step   goal: {GOALS['diffusion']}: "
                     f"{_goal(d.get('goal_met'))} (judged on the fastest pair-carry loop: {d.get('best_jax_route')})")
        lines += [f"  {r['route']:45s} {r['us_per_step']:8.2f}" for r in d["rows"]]
    h = result.get("stencil_hlo")
    if h:
        lines += ["", f"5-point stencil fori_loop, compiled HLO    goal: {GOALS['stencil_hlo']}: {_goal(h.get('goal_met'))}"]
        lines += [f"  {r['loop']:45s} copies in body {r['copies_in_while_body']}, elsewhere {r['copies_elsewhere']}, "
                  f"conditionals {r['conditionals']}" for r in h["rows"]]
        lines.append(f"  lax.platform_dependent on this GPU: {h.get('platform_dependent_conditionals')} conditional(s)")
    m = result.get("muladd_1gib")
    if m and "jax_vs_torch" in m:
        lines += ["", f"1 GiB a*b+c, ms/call (10 back-to-back, one sync)    goal: {GOALS['muladd_1gib']}: "
                      f"{_goal(m.get('goal_met'))}",
                  f"  pnex kernel through JAX      {m['jax_pnex_ms']:.3f}  ({m['TBps_jax_pnex']:.2f} TB/s)",
                  f"  same kernel, PyTorch op      {m['torch_op_ms']:.3f}  (CUDA events {m['torch_op_event_ms']:.3f})",
                  f"  XLA's fused a*b+c            {m['jax_xla_fused_ms']:.3f}",
                  f"  pnex, c += a*b in place (JAX, c donated: no result allocated) "
                  f"{m.get('jax_pnex_donated_inmut_ms', float('nan')):.3f}",
                  f"  JAX / PyTorch op {m['jax_vs_torch']:.3f}x, JAX / XLA {m['jax_vs_xla']:.3f}x"]
    dn = result.get("donation")
    if dn:
        lines += ["", "256 MiB InMut kernel, ms/call"]
        lines += [f"  {k:36s} {v['ms_per_call']:.3f}  (copies {v['hlo']['copies_elsewhere']})"
                  for k, v in dn.items() if isinstance(v, dict)]
    rows = result.get("per_call")
    if rows:
        lines += ["", f"per call, 1024 float32      µs pipelined   synced   vs jit(x+1)    goal: {GOALS['per_call']}"]
        for r in rows:
            ratio = (f"{r['pipelined_vs_x_plus_1']:.2f}x / {r['synced_vs_x_plus_1']:.2f}x"
                     if "pipelined_vs_x_plus_1" in r else "")
            lines.append(f"  {r['route']:38s} {r['us_pipelined']:8.2f} {r['us_synced']:8.2f}   {ratio:15s} "
                         f"{_goal(r.get('goal_met'))}")
    f = result.get("first_use")
    if f and "new_kernel" in f:
        lines += ["", f"first use in JAX (fresh processes; imports and JAX's GPU client excluded)    goal: {GOALS['first_use']}: "
                      f"{_goal(f.get('goal_met'))}"]
        for name in ("new_kernel", "unchanged_kernel", "after_pytorch_same_process"):
            r = f[name]
            extra = (f", PyTorch op first {r['torch_first_call_s']:.3f} s" if "torch_first_call_s" in r else "")
            extra += (f", cache {r.get('define_cache_hits')} hit(s) / {r.get('define_cache_misses')} miss(es), "
                      f"compiled again by JAX: {r['compiled_variants_added_by_jax']}, "
                      f"PyTorch CUDA initialised: {r.get('torch_cuda_initialised')}")
            lines.append(f"  {name:28s} total {r['total_s']:.3f} s (define {r['define_s']:.3f}, lower {r['lower_s']:.3f}, "
                         f"compile {r['compile_s']:.3f}, run {r['run_s']:.3f}){extra}")
    c = result.get("command_buffers")
    if c:
        lines += ["", f"with {c['xla_flags']}"] + [f"  {k:45s} {v:8.2f} µs/step" for k, v in c["us_per_step"].items()]
    if result.get("errors"):
        lines += ["", f"{len(result['errors'])} section(s) FAILED; see the JSON's errors"]
    return "\n".join(lines)
