"""`braid bench ...`: measured, never asserted. Each workload prints a table and writes JSON.

One module a workload, each with `add_parser(workloads)`; what they share is in `common`."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add `bench` and its workloads to `commands`; returns the workloads' subparsers."""
    # Imported here, not above: `programs` runs @program functions, so importing it loads the
    # frontend (`braid`) that sits above the runtime.
    from braid.runtime.cli.bench import (
        adapters,
        agents,
        batch,
        chat,
        decode,
        fewshot,
        grammar,
        kernels,
        peers,
        programs,
        reasoning,
        scaleout,
        server_load,
        soak,
        spec,
    )

    bench = commands.add_parser("bench", help="run a benchmark workload")
    workloads = bench.add_subparsers(dest="workload", required=True, metavar="WORKLOAD")
    for workload in (
        decode,
        fewshot,
        batch,
        adapters,
        chat,
        grammar,
        reasoning,
        kernels,
        server_load,
        soak,
        spec,
        programs,
        agents,
        peers,
        scaleout,
    ):
        workload.add_parser(workloads)
    return workloads


def workload_names() -> list[str]:
    """The workloads `braid bench` runs, in its help's order (read off the parser itself)."""
    commands = argparse.ArgumentParser().add_subparsers()
    return list(add_parser(commands).choices)
