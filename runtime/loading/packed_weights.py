"""A GGUF model's quantized linears as the CPU kernels lay them out, kept in one file beside
its converted directory and mapped on later loads.

Converting a file's blocks into braid's formats and interleaving them for the kernels takes
seconds a load on a 1B model (docs/runtime.md); mapped, a load reads nothing until a forward
touches the weights, whose pages then belong to the file: shared by every process that maps
it and handed back under memory pressure, as llama.cpp's mapped GGUF is.

The file: 8 bytes of header length, a JSON header (each module path's offset, shape and
format), then the blocks, each at a 64-byte boundary. Its name carries a digest of the GGUF
file (path, size, time) and of what shapes the layout (kernels/cpu/quant.py, the kernels' group
size): a change of any makes a new file, and the stale ones are removed when it is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from pathlib import Path

import numpy as np
import torch

from braid.kernels.cpu import quant
from braid.runtime.models.layers.quantized import QuantLinear

log = logging.getLogger(__name__)

_ALIGN = 64


def path_for(model_dir: Path, gguf_path: Path, group: int) -> Path:
    """Where the packed blocks of `gguf_path` (converted into `model_dir`) for kernels of
    `group` rows live."""
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0group={group}\0"
    digest = hashlib.sha256(key.encode() + Path(quant.__file__).read_bytes())
    return model_dir / f"packed-{digest.hexdigest()[:16]}.bin"


def read(path: Path) -> dict[str, tuple[str, torch.Tensor]]:
    """Module path -> (format, blocks) mapped from the file; {} where there is none or it
    cannot be read (the caller packs the blocks again)."""
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        # Copy-on-write: writable for torch without a copy; nothing ever writes to it.
        mapped = np.memmap(path, np.uint8, mode="c")
        data = _data_start(length)
        out = {}
        for name, (offset, rows, row_bytes, fmt) in header.items():
            begin, end = data + offset, data + offset + rows * row_bytes
            if end > len(mapped):
                raise ValueError(f"{name} runs past the end")
            out[name] = fmt, torch.from_numpy(mapped[begin:end].reshape(rows, row_bytes))
        return out
    except (OSError, ValueError, struct.error) as e:
        log.warning("ignoring unreadable packed weights %s (%s)", path, e)
        return {}


def write(model: torch.nn.Module, path: Path) -> None:
    """Every packed QuantLinear of `model` into `path` (atomically), replacing stale files."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    if not layers or any(m.kernels is None for m in layers.values()):
        return
    header, offset = {}, 0
    for name, m in layers.items():
        rows, row_bytes = m.blocks.shape
        header[name] = [offset, rows, row_bytes, m.fmt]
        offset += -(-rows * row_bytes // _ALIGN) * _ALIGN
    text = json.dumps(header).encode()
    data = _data_start(len(text))
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for name, (at, *_) in header.items():
                f.seek(data + at)
                f.write(layers[name].blocks.numpy().tobytes())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        log.warning("cannot keep the packed weights in %s: %s", path, e)
        return
    for stale in path.parent.glob("packed-*.bin"):
        if stale != path:
            stale.unlink(missing_ok=True)


def _data_start(header_length: int) -> int:
    return -(-(8 + header_length) // _ALIGN) * _ALIGN
