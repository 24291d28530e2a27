"""The build process of :mod:`pnex_magic.launch.background`:
``python -m pnex_magic.launch.build_worker '<build as JSON>'`` builds one
:class:`~pnex_magic.launch.build.Build` (see :func:`pnex_magic.launch.background.run`)."""

from __future__ import annotations

import sys

from .background import run
from .build import Build


def main(argv: list[str]) -> int:
    return run(Build.from_json(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
