"""A GGUF file's tensors (name, type, shape and their bytes, mapped from the file), read
without its metadata values.

The `gguf` package's reader builds every metadata field as numpy views, which takes seconds
for a tokenizer's strings (docs/runtime.md). Loading needs only the tensor index, which
follows the metadata: the values are skipped by their lengths here, and the tensors' bytes
are views of one read-only mapping. Every
offset and length is checked against the file, and the tensors' data must be aligned, in the
file and apart: a truncated or malformed file is a ValueError naming the file and what is
wrong. Other readers (the `gguf` package's, which transformers uses) fail on such files with
struct.error or numpy's errors, or read a misaligned tensor's bytes as weights, so
runtime/loading/gguf/files.py has this reader check a file before they see it.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)  # 64-bit counts and lengths (version 1's 32-bit ones are long gone)
# Metadata value types: their sizes, strings (8) and arrays (9) aside.
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32
# Bounds no model file comes near, past which a count is corruption: each index entry and
# array item costs the readers that build them (ours, the gguf package's) Python objects, so
# a crafted file of a few GB could otherwise hold tens of GB of them. (The largest
# vocabularies have ~256k entries; the largest models ~2k tensors.)
_MAX_TENSORS = 1 << 20
_MAX_ARRAY_ITEMS = 1 << 24


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # ggml's order: a row's length first
    data: np.ndarray  # uint8 [rows, row bytes], read-only, mapped from the file

    @property
    def rows(self) -> int:
        return self.data.shape[0]


class _Cursor:
    def __init__(self, buffer, path: Path) -> None:
        self.buffer, self.pos, self.path = buffer, 0, path

    def take(self, size: int) -> int:
        """The position of the next `size` bytes, which must be in the file."""
        start = self.pos
        if start + size > len(self.buffer):  # a truncated file, or a corrupt length
            raise ValueError(
                f"{self.path}: not a valid GGUF file (truncated at byte {start}: {size} bytes "
                f"needed, {len(self.buffer) - start} left)"
            )
        self.pos += size
        return start

    def unpack(self, fmt: str):
        return struct.unpack_from(fmt, self.buffer, self.take(struct.calcsize(fmt)))

    def string(self) -> str:
        (length,) = self.unpack("<Q")
        start = self.take(length)
        try:
            return bytes(self.buffer[start : start + length]).decode()
        except UnicodeDecodeError:
            raise ValueError(f"{self.path}: a GGUF string at byte {start} is not UTF-8") from None

    def skip_strings(self, count: int) -> None:
        """Past `count` strings (a tokenizer's vocabulary: tens of thousands) in one loop."""
        buffer, pos, end = self.buffer, self.pos, len(self.buffer)
        for _ in range(count):
            if pos + 8 > end:
                break
            pos += 8 + struct.unpack_from("<Q", buffer, pos)[0]
        else:
            if pos <= end:
                self.pos = pos
                return
        raise ValueError(f"{self.path}: not a valid GGUF file (truncated at byte {pos})")

    def skip_value(self, kind: int) -> None:
        if kind in _SCALAR_SIZES:
            self.take(_SCALAR_SIZES[kind])
        elif kind == _STRING:
            (length,) = self.unpack("<Q")
            self.take(length)
        elif kind == _ARRAY:
            item, count = self.unpack("<IQ")
            if count > _MAX_ARRAY_ITEMS:
                raise ValueError(
                    f"{self.path}: a GGUF array of {count} items at byte {self.pos - 12} "
                    f"(at most {_MAX_ARRAY_ITEMS} are read)"
                )
            if item in _SCALAR_SIZES:
                self.take(_SCALAR_SIZES[item] * count)
            elif item == _STRING:
                self.skip_strings(count)
            elif item == _ARRAY:
                for _ in range(count):
                    self.skip_value(item)
            else:
                raise ValueError(f"{self.path}: unknown GGUF value type {item}")
        else:
            raise ValueError(f"{self.path}: unknown GGUF value type {kind}")


def read_tensors(path: Path) -> list[GGUFTensor]:
    """The file's tensors, in the file's order."""
    try:
        return _read_tensors(path)
    except RecursionError:  # arrays nested thousands deep: skip_value recursed into them
        raise ValueError(f"{path}: not a valid GGUF file (arrays nested too deep)") from None


def _read_tensors(path: Path) -> list[GGUFTensor]:
    import gguf

    with open(path, "rb") as f:
        try:
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise ValueError(f"{path}: not a GGUF file (empty)") from None
    cursor = _Cursor(memoryview(buffer), path)
    if bytes(cursor.buffer[: len(_MAGIC)]) != _MAGIC:
        raise ValueError(f"{path}: not a GGUF file (no GGUF magic)")
    cursor.take(len(_MAGIC))
    (version,) = cursor.unpack("<I")
    if version not in _VERSIONS:
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    count, kv_count = cursor.unpack("<QQ")
    if count > _MAX_TENSORS:
        raise ValueError(f"{path}: not a valid GGUF file (a count of {count} tensors)")
    alignment = _DEFAULT_ALIGNMENT
    for _ in range(kv_count):
        key = cursor.string()
        (kind,) = cursor.unpack("<I")
        if key == "general.alignment":
            if kind != 4:  # a uint32, as llama.cpp requires: another is no alignment we know
                raise ValueError(f"{path}: general.alignment is of GGUF type {kind}, not uint32")
            (alignment,) = cursor.unpack("<I")
            if alignment == 0 or alignment & (alignment - 1):
                raise ValueError(f"{path}: GGUF alignment {alignment} is not a power of two")
        else:
            cursor.skip_value(kind)
    index = []
    for _ in range(count):
        name = cursor.string()
        (dims,) = cursor.unpack("<I")
        if not 1 <= dims <= 4:
            raise ValueError(f"{path}: tensor {name} has {dims} dimensions")
        shape = cursor.unpack(f"<{dims}Q")
        kind, offset = cursor.unpack("<IQ")
        try:
            index.append((name, gguf.GGMLQuantizationType(kind), shape, offset))
        except ValueError:
            raise ValueError(f"{path}: tensor {name} has unknown type {kind}") from None
    data_start = -(-cursor.pos // alignment) * alignment
    tensors, extents = [], []
    for name, kind, shape, offset in index:
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        if shape[0] % block:
            raise ValueError(f"{path}: tensor {name}'s rows are not whole {kind.name} blocks")
        # Offsets are aligned so that a row's blocks (and the kernels' loads) start where
        # the writer put them: a shifted tensor reads its neighbour's bytes as weights.
        if offset % alignment:
            raise ValueError(
                f"{path}: tensor {name}'s data offset {offset} is not a multiple of the "
                f"file's alignment ({alignment})"
            )
        row_bytes = shape[0] // block * block_bytes
        rows = math.prod(shape[1:])  # Python ints: dimensions of 2**40 must not wrap
        if rows >> 63 or shape[0] >> 63:  # ggml counts in int64 (an empty tensor's rows too)
            raise ValueError(f"{path}: tensor {name}'s shape {shape} is past int64")
        start, size = data_start + offset, rows * row_bytes
        if start + size > len(buffer):
            raise ValueError(f"{path}: tensor {name}'s data runs past the end of the file")
        extents.append((start, start + size, name))
        data = np.frombuffer(buffer, np.uint8, size, start).reshape(rows, row_bytes)
        tensors.append(GGUFTensor(name, kind, shape, data))
    _check_apart(path, extents)
    return tensors


def _check_apart(path: Path, extents: list[tuple[int, int, str]]) -> None:
    """Each tensor's bytes its own: no two tensors share a byte, nor a name."""
    names = set()
    previous_end, previous = 0, ""
    for start, end, name in sorted(extents):
        if name in names:
            raise ValueError(f"{path}: tensor {name} is given twice")
        names.add(name)
        if start < previous_end:
            raise ValueError(f"{path}: tensor {name}'s data overlaps tensor {previous}'s")
        if end > start:  # an empty tensor occupies nothing
            previous_end, previous = end, name
