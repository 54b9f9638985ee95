"""Lazy exports: a package names what it offers and imports each name's module on first use.

Importing any module of braid imports the packages above it first (`braid.grammars.regex.lazy`
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
        # Bind every export whose module is loaded (a module still importing may lack its
        # names yet), so later lookups skip this function. That also undoes the import system
        # binding a module on its package under its own name where an export has that name
        # (`braid.program`, the decorator of the module braid/program.py).
        namespace = sys.modules[package]
        for export, module_name in where.items():
            module = sys.modules.get(module_name)
            if module is not None and export in vars(module):
                setattr(namespace, export, vars(module)[export])
        setattr(namespace, name, value)
        return value

    return __getattr__
