"""The child process of ``pnex.profile`` and ``%%pnex --profile`` (:mod:`pnex_magic.profiling`),
run under Nsight Compute:

    python -m pnex_magic._profile_child FOLDER

``FOLDER`` holds ``kernel.pnex`` (the op, :func:`pnex_magic.save`), ``args.pt``
(``torch.save`` of ``{"args": [...], "cuda": [...]}``: the arguments, tensors on the
CPU, and which of them go to the GPU) and ``launch.json`` (``{"block": [...], "tune":
{...}, "entry": "...", "device": 0}``: the launch the parent's call ran with).  The
child launches the kernel once, exactly so (that block, those ``Tune`` values,
through the Python driver launcher: no autotuning, no other launch of it), and
synchronises.  Exit status: 0 when it ran, 1 when the launch raised, 2 on bad usage,
3 when the saved kernel is not the one the parent meant (another entry name).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FILES = ("kernel.pnex", "args.pt", "launch.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pnex_magic._profile_child",
        description="Launch a saved pnex op's kernel once, as a call ran it (the child of pnex.profile).",
    )
    parser.add_argument("folder", type=Path, help="a folder holding kernel.pnex, args.pt and launch.json")
    options = parser.parse_args(argv)
    folder: Path = options.folder
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        parser.error(f"{folder} has no {' or '.join(missing)}")

    import torch

    import pnex_magic as pnex
    from pnex_magic.calls import bind_arguments, check_arguments, launch_grid, output_shapes
    from pnex_magic.launch.driver import DriverLauncher
    from pnex_magic.random import draw_seed

    launch = json.loads((folder / "launch.json").read_text())
    device = torch.device("cuda", int(launch.get("device", 0)))
    saved = torch.load(folder / "args.pt", weights_only=True)
    args = [a.to(device) if on_gpu else a for a, on_gpu in zip(saved["args"], saved["cuda"])]
    if saved.get("maps"):  # tensor maps hold their tensor's address: made again for the copies here
        from pnex_magic.tc.tensormap import remake_maps

        args = remake_maps(args, saved["maps"])
    op = pnex.load(folder / "kernel.pnex")
    definition = op._pnex
    spec = definition.spec
    values = tuple(launch["tune"].get(p.name) for p in spec.tune_params)
    if values not in spec.tune_variants:
        print(f"pnex-profile: the saved kernel has no variant {launch['tune']}", file=sys.stderr)
        return 3
    variant = spec.tune_variants.index(values)
    env = bind_arguments(spec, args)
    env.update(spec.tune_values(variant))
    try:
        check_arguments(spec, env)
        for p, shape in zip(spec.outputs, output_shapes(spec, env)):
            env[p.name] = (torch.empty(shape, dtype=p.dtype.torch, device=device) if p.init is None
                           else torch.full(shape, p.init, dtype=p.dtype.torch, device=device))
        for p in spec.seeds:
            env[p.name] = draw_seed(device)
        layout = "C" if all(t.is_contiguous() for p, t in zip(spec.arguments, args) if hasattr(t, "is_contiguous")) \
            else "A"
        _, entry = definition.kernel_image("sm_%d%d" % torch.cuda.get_device_capability(device), layout, variant)
        if entry != launch["entry"]:
            print(f"pnex-profile: the saved kernel's entry is {entry}, not {launch['entry']}", file=sys.stderr)
            return 3
        grid, block = launch_grid(spec, env, launch["block"])
        DriverLauncher().launch(definition, [env.get(p.name) for p in spec.params], grid, block, device, variant)
        torch.cuda.synchronize(device)
    except Exception as exc:  # ncu's output and this line say why
        print(f"pnex-profile: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
              file=sys.stderr)
        return 1
    print(f"pnex-profile: launched {spec.name}() once, grid {grid}, block {block}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
