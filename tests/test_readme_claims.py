"""README's lists against what the code registers: the model architectures the loader
accepts, the routes the server serves, the workloads `braid bench` runs. Each list is read out
of README.md as it is written (names in backticks), so that a name added to one side only
fails here."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).parents[1] / "README.md").read_text()


def section(title: str) -> str:
    """README's `## title` section, to the next one."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end >= 0 else len(README)]


def bullet(text: str, opening: str) -> str:
    """The bullet of `text` that opens with `opening`, its continuation lines included."""
    lines = text.splitlines()
    [first] = [i for i, line in enumerate(lines) if line.startswith(f"- {opening}")]
    end = first + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return "\n".join(lines[first:end])


def test_readme_names_every_architecture_the_loader_accepts():
    from braid.runtime.models import SUPPORTED_ARCHITECTURES

    models = bullet(section("What works today"), "**Models**")
    named = re.findall(r"`(\w+For\w+)`", models)
    assert len(named) == len(set(named)), named
    code = set(SUPPORTED_ARCHITECTURES)
    assert set(named) == code, {"README only": set(named) - code, "code only": code - set(named)}


def test_readme_names_every_route_the_server_serves():
    from starlette.routing import Route

    from braid.runtime.server.app import route_table

    served = set()
    for route in route_table(lora_updates=True):  # every route braid serve can have
        assert isinstance(route, Route), route
        served.add(re.sub(r":\w+}", "}", route.path))  # {model_id:path}: {model_id}
    named = set(re.findall(r"`(/[^`\s]*)`", section("The server")))
    assert named == served, {"README only": named - served, "code only": served - named}


def test_readme_names_every_bench_workload():
    from braid.runtime.cli.bench import workload_names

    benchmarks = bullet(section("What works today"), "**Benchmarks**")
    [listed] = re.findall(r"`braid bench ([^`]+)`", benchmarks)
    named = [name.strip() for name in listed.split("|")]
    assert len(named) == len(set(named)), named
    code = set(workload_names())
    assert set(named) == code, {"README only": set(named) - code, "code only": code - set(named)}
