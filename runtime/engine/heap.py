"""Handing freed heap memory back to the operating system (glibc only)."""

from __future__ import annotations

import ctypes


def release_free_heap() -> None:
    """glibc keeps freed blocks of the per-step tensors in its arenas, so resident memory
    creeps up over many requests; trimming returns them. No-op elsewhere."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _load_libc()
