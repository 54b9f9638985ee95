"""runtime/loading/gguf/tensors.py: a GGUF file's tensor index and bytes as the gguf package reads
them, and malformed files refused with an error that names the problem."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from conftest import random_gguf

from braid.runtime.loading.gguf.tensors import read_tensors

T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A small GGUF: metadata of every kind (string arrays included), a float tensor and
    quantized ones, with an alignment of its own."""
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_custom_alignment(64)
    writer.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [0.5] * 300)
    writer.add_string("general.name", "small")
    writer.add_float64("some.float", 1.5)
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(64).astype(np.float32))
    for name, kind in (("a.weight", T.Q4_K), ("b.weight", T.Q8_0), ("c.weight", T.Q6_K)):
        blocks = random_gguf().random_matrix(rng, kind, 3, 512, 0.02)
        writer.add_tensor(name, blocks, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_tensors_are_the_gguf_packages(written):
    ours = read_tensors(written)
    theirs = gguf.GGUFReader(str(written)).tensors
    assert [t.name for t in ours] == [t.name for t in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert a.type == b.tensor_type and a.shape == tuple(int(x) for x in b.shape)
        assert np.array_equal(a.data.reshape(-1), np.asarray(b.data).view(np.uint8).reshape(-1))
    assert ours[1].rows == 3 and ours[1].data.shape == (3, 2 * 144)
    assert not ours[1].data.flags.writeable  # a view of the mapped file


def broken(tmp_path, data: bytes):
    path = tmp_path / "broken.gguf"
    path.write_bytes(data)
    return path


def test_malformed_files_are_refused_by_what_is_wrong(written, tmp_path):
    good = written.read_bytes()
    cases = [
        (b"", "empty"),
        (b"GGML" + good[4:], "no GGUF magic"),
        (good[:4] + struct.pack("<I", 7) + good[8:], "version 7"),
        (good[:200], "truncated"),
        (good[: len(good) - 100], "past the end"),
        # A huge tensor count: the tensor data read as more tensors' names and shapes fails
        # somewhere, naming the file.
        (good[:8] + struct.pack("<Q", 2**40) + good[16:], "broken.gguf: "),
    ]
    for data, message in cases:
        with pytest.raises(ValueError, match=message):
            read_tensors(broken(tmp_path, data))


def test_arrays_nested_thousands_deep_are_refused(tmp_path):
    depth = 100_000
    kv = struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9)  # key "k", an array...
    kv += struct.pack("<IQ", 9, 1) * depth  # ...of arrays, each of one array
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv
    with pytest.raises(ValueError, match="nested too deep"):
        read_tensors(broken(tmp_path, data))
