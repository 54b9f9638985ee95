"""The `braid` console script: runtime's commands plus the workloads that run programs."""

from __future__ import annotations

import sys

from lang import bench
from runtime import cli


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, extra_workloads=[bench.add_parser])


if __name__ == "__main__":
    sys.exit(main())
