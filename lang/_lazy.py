"""Lazy exports: a package names what it offers and imports each name's module on first use.

Importing any module of braid imports the packages above it first (`braid.grammars.lazy`
runs `braid/__init__` and `braid/grammars/__init__`), so those stay cheap: the compile
worker starts without torch, and `import braid` works where torch is not installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: `where[name]` is the module defining `name`."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(where[name]), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    return __getattr__
