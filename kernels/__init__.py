"""Triton kernels and their plain-PyTorch reference twins (`kernels.reference`); C++ kernels
for the CPU path (`kernels.cpu`, built on first use with the system compiler).

The Triton modules load on first use: `import kernels` stays cheap where there is no GPU, and
TRITON_INTERPRET, which triton reads when a kernel is defined, can still be set before then.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_WHERE = {
    "decode_attention": "kernels.decode",
    "extend_attention": "kernels.extend",
    "rope_store_kv": "kernels.rope",
    "sample": "kernels.sampling",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
