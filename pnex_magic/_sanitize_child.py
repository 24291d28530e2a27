"""The child process of ``%%pnex --sanitize`` (:mod:`pnex_magic.sanitize`):

    python -m pnex_magic._sanitize_child FOLDER

``FOLDER`` holds ``kernel.pnex`` (the op, :func:`pnex_magic.save`) and ``args.pt``
(``torch.save`` of ``{"args": [...], "cuda": [...]}``: the arguments, tensors on the
CPU, and which of them go to the GPU).  The child loads both, calls the op once,
synchronises and exits 0; it exits 1 when the op raises (under compute-sanitizer,
a kernel with a memory error is stopped and the call fails: the tool's log says
why) and 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pnex_magic._sanitize_child",
        description="Run a saved pnex op once on saved arguments (the child of %%pnex --sanitize).",
    )
    parser.add_argument("folder", type=Path, help="a folder holding kernel.pnex and args.pt")
    options = parser.parse_args(argv)
    folder: Path = options.folder
    missing = [name for name in ("kernel.pnex", "args.pt") if not (folder / name).is_file()]
    if missing:
        parser.error(f"{folder} has no {' or '.join(missing)}")

    import torch

    import pnex_magic as pnex

    saved = torch.load(folder / "args.pt", weights_only=True)
    args = [a.cuda() if on_gpu else a for a, on_gpu in zip(saved["args"], saved["cuda"])]
    if saved.get("maps"):  # tensor maps hold their tensor's address: made again for the copies here
        from pnex_magic.tc.tensormap import remake_maps

        args = remake_maps(args, saved["maps"])
    op = pnex.load(folder / "kernel.pnex")
    try:
        op(*args)
        torch.cuda.synchronize()
    except Exception as exc:  # the tool's log tells why; say that the call failed
        print(f"pnex-sanitize: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
              file=sys.stderr)
        return 1
    print(f"pnex-sanitize: ran {op._pnex.spec.name}()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
