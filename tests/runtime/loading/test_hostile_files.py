"""Hostile model files: malformed GGUFs are a ValueError naming the file and what is wrong
(never struct.error, never garbage weights), whatever reads them; chat templates that run
without end are refused with an error naming the bound, at load and on each request,
instead of hanging the CLI, the server's start-up or a request."""

from __future__ import annotations

import itertools
import json
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
import transformers
from conftest import LiveServer, random_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_cases import HERMES_TEMPLATE

from braid.runtime.loading.gguf import files as gguf_file
from braid.runtime.loading.gguf.tensors import read_tensors
from braid.runtime.server.chat import tools
from braid.runtime.text import template_render
from braid.runtime.text.chat_template import ChatTemplate
from braid.runtime.text.template_render import TemplateLimitError
from braid.runtime.text.tokenizer import load_tokenizer

T = gguf.GGMLQuantizationType

# ---- GGUF files ------------------------------------------------------------------------------


_TENSORS = [("norm.weight", 1), ("a.weight", 2), ("b.weight", 2)]  # (name, dimensions)


def _small_gguf(path: Path) -> Path:
    """Metadata of every kind (a string array, a nested array), an alignment of its own,
    a float tensor and quantized ones."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_custom_alignment(64)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(20)])
    writer.add_array("some.nested", [[1, 2], [3]])
    writer.add_float32("some.float", 0.5)
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(64).astype(np.float32))
    for name, kind in (("a.weight", T.Q8_0), ("b.weight", T.Q4_K)):  # as _TENSORS lists
        blocks = random_gguf().random_matrix(rng, kind, 2, 256, 0.02)
        writer.add_tensor(name, blocks, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> bytes:
    return _small_gguf(tmp_path_factory.mktemp("gguf") / "small.gguf").read_bytes()


def _field_at(data: bytes, name: str, dims: int) -> int:
    """Where tensor `name`'s data offset is, in its entry of the tensor index."""
    entry = data.index(struct.pack("<Q", len(name)) + name.encode())
    return entry + 8 + len(name) + 4 + 8 * dims + 4


def _with_offset(data: bytes, name: str, dims: int, offset: int) -> bytes:
    at = _field_at(data, name, dims)
    return data[:at] + struct.pack("<Q", offset) + data[at + 8 :]


def _offset(data: bytes, name: str, dims: int) -> int:
    return _offset_of(data, _field_at(data, name, dims))


def _offset_of(data: bytes, at: int) -> int:
    return struct.unpack_from("<Q", data, at)[0]


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    return path


def test_misplaced_tensors_are_refused(small_gguf, tmp_path):
    b = _offset(small_gguf, "b.weight", 2)
    cases = [
        # Shifted by a byte: read, it would be the neighbour's bytes taken as weights.
        (b + 1, r"b\.weight's data offset \d+ is not a multiple of the file's alignment \(64\)"),
        (_offset(small_gguf, "a.weight", 2), r"[ab]\.weight's data overlaps tensor [ab]\.weight"),
        (1 << 50, r"b\.weight's data runs past the end"),
    ]
    read_tensors(_write(tmp_path, small_gguf))  # the file as written is fine
    for offset, message in cases:
        path = _write(tmp_path, _with_offset(small_gguf, "b.weight", 2, offset))
        with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + message):
            read_tensors(path)


def test_dimensions_past_int64_are_refused(tmp_path):
    # Float tensors in a file of 16 bytes of data. 4 x 2**32 x 2**32: numpy's int64 product
    # of its rows wrapped to 0, and an empty tensor was loaded. 0 x 2**64-1: empty, but no
    # array has that many rows (numpy's error named no file).
    for shape in ((4, 2**32, 2**32), (0, 2**64 - 1)):
        index = struct.pack("<Q", 1) + b"w" + struct.pack("<I", len(shape))
        index += struct.pack(f"<{len(shape)}QIQ", *shape, T.F32, 0)
        head = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + index
        path = _write(tmp_path, head + bytes(-len(head) % 32) + bytes(16))
        with pytest.raises(ValueError, match=re.escape(str(path)) + ": tensor w's .* past int64"):
            read_tensors(path)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny Llama GGUF with the default model's tokenizer: what transformers converts."""
    return random_gguf().write_random_gguf(
        tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf", "tiny", "Q8_0"
    )


def test_malformed_ggufs_are_refused_before_transformers_reads_them(
    tiny_gguf, tmp_path, monkeypatch
):
    """The first load converts a GGUF with transformers, whose reader (the gguf package's)
    met these with struct.error, a UnicodeDecodeError or numpy's reshape error."""
    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path / "cache"))
    good = tiny_gguf.read_bytes()
    cases = {
        "tensor-count": (good[:8] + struct.pack("<Q", 2**40) + good[16:], "a count of"),
        "kv-count": (good[:16] + struct.pack("<Q", 2**40) + good[24:], "truncated at byte"),
        "string-length": (good[:24] + struct.pack("<Q", 2**60) + good[32:], "bytes needed"),
        "truncated-metadata": (good[:5000], "truncated at byte"),
        "truncated-data": (good[: len(good) // 2], "runs past the end of the file"),
    }
    for name, (data, problem) in cases.items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(data)
        with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + problem):
            gguf_file.model_dir(path)
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


# ---- the fuzz --------------------------------------------------------------------------------

_COUNTS = [0, 1, 2**31, 2**32 - 1, 2**40, 2**60, 2**63, 2**64 - 1]


@st.composite
def _mutated(draw, data: bytes) -> bytes:
    """`data` truncated, bit-flipped, with a count or a tensor's offset overwritten, bytes
    spliced in or cut."""
    offsets = [_field_at(data, name, dims) for name, dims in _TENSORS]
    for _ in range(draw(st.integers(1, 3))):
        n = len(data)
        kind = draw(st.sampled_from(["truncate", "flip", "count", "offset", "splice", "cut"]))
        if kind == "offset" and offsets[-1] + 8 <= n:
            # Another tensor's offset, one near it, or any: shifted, shared or out of range.
            at, other = draw(st.sampled_from(offsets)), draw(st.sampled_from(offsets))
            value = _offset_of(data, other) + draw(st.sampled_from([0, 0, 1, 32, 64, 1 << 40]))
            data = data[:at] + struct.pack("<Q", value % (1 << 64)) + data[at + 8 :]
        elif kind == "truncate":
            data = data[: draw(st.integers(0, n))]
        elif kind == "flip" and n:
            flips = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 7)), max_size=8))
            buf = bytearray(data)
            for at, bit in flips:
                buf[at] ^= 1 << bit
            data = bytes(buf)
        elif kind == "count" and n >= 8:
            at, width = draw(st.integers(0, n - 8)), draw(st.sampled_from([4, 8]))
            value = draw(st.sampled_from(_COUNTS)) % (1 << (8 * width))
            data = data[:at] + value.to_bytes(width, "little") + data[at + width :]
        elif kind == "splice":
            at = draw(st.integers(0, n))
            data = data[:at] + draw(st.binary(max_size=32)) + data[at:]
        elif kind == "cut" and n:
            at = draw(st.integers(0, n - 1))
            data = data[:at] + data[at + draw(st.integers(1, 64)) :]
    return data


def _fuzz_once(data: bytes) -> None:
    """Read or refused with a ValueError naming the file; what is read lies apart."""
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), data)
        try:
            tensors = read_tensors(path)
        except ValueError as e:
            assert str(path) in str(e), e
            return
        spans = sorted(
            (t.data.ctypes.data, t.data.ctypes.data + t.data.nbytes) for t in tensors if t.data.size
        )
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), spans


def _base() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        return _small_gguf(Path(folder) / "base.gguf").read_bytes()


_BASE = _base()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(_mutated(_BASE))
def test_a_mutated_gguf_is_read_or_refused_with_a_value_error(data):
    _fuzz_once(data)


@pytest.mark.slow
@settings(
    max_examples=20_000, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(_mutated(_BASE))
def test_a_mutated_gguf_is_read_or_refused_with_a_value_error_long(data):
    _fuzz_once(data)


# ---- chat templates --------------------------------------------------------------------------

# Each runs past a bound; each hung transformers' renderer (or filled memory).
HOSTILE = {
    "nested loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "steps",
    ),
    "loops over a literal": (
        "{% set s = 'x' * 50000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        "steps",
    ),
    "a macro calling itself twice": (
        "{% macro f(n) %}{% if n < 60 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}"
        "{{ f(0) }}",
        "steps|ran for more than",
    ),
    "a macro calling itself": (
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "recursed deeper",
    ),
    "a recursive loop": (
        "{% for x in range(100000) recursive %}{% if loop.depth < 4 %}"
        "{{ loop(range(100000)) }}{% endif %}{% endfor %}",
        "steps|ran for more than",
    ),
    "a filter's endless output": ("{{ [1]|slice(10 ** 12)|list|length }}", "steps|ran for"),
    "a string repeated": ("{{ 'a' * 10 ** 12 }}", "repeats a str"),
    "a power": ("{{ 2 ** (2 ** 40) }}", "an int of over"),
    "an int squared on": (
        "{% set ns = namespace(x=3) %}{% for i in range(100) %}{% set ns.x = ns.x * ns.x %}"
        "{% endfor %}",
        "an int of over",
    ),
    "a string doubled by ~": (
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        "built a str",
    ),
    "a block doubled": (
        "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set t %}{{ ns.s }}"
        "{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}",
        "joins 2 strings",
    ),
    "a join of copies": ("{% set s = 'x' * 10000000 %}{{ ([s] * 1000)|join }}", "joins 1,000"),
    "a flood of output": (
        "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
        "wrote more than",
    ),
}


@pytest.fixture(scope="module")
def own_tokenizer(default_model_path):
    """The default model's tokenizer, a copy of this module's whose template tests replace."""
    return transformers.AutoTokenizer.from_pretrained(default_model_path)


def steps_bound_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put a render's time bound out of reach, so that a loop meets the step bound on any
    machine (a loaded one takes longer than the 2 s bound for 1,000,000 steps)."""
    monkeypatch.setattr(template_render, "MAX_SECONDS", 600.0)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_template_that_runs_without_end_is_stopped(own_tokenizer, name, monkeypatch):
    template, problem = HOSTILE[name]
    if problem == "steps":
        steps_bound_first(monkeypatch)
    own_tokenizer.chat_template = template
    with pytest.raises(TemplateLimitError, match=problem):
        template_render.render(own_tokenizer, [{"role": "user", "content": "hi"}])


# A template using what chat templates use: macros, namespaces, loop variables, recursion,
# transformers' tojson and `{% generation %}`, string methods and filters.
FANCY = """{%- macro show(x) -%}{%- if x is mapping -%}{ {%- for k, v in x|dictsort -%}{{ k }}: \
{{ show(v) }}{{ ', ' if not loop.last }}{%- endfor -%} }{%- else -%}{{ x }}{%- endif -%}\
{%- endmacro -%}
{%- set ns = namespace(n=0, last='') -%}
{%- for m in messages -%}{%- set ns.n = ns.n + 1 -%}{%- set ns.last = m.role -%}
{%- if m.role == 'assistant' %}{% generation %}<|im_start|>assistant
{{ m.content | trim }}<|im_end|>{% endgeneration %}
{% else %}<|im_start|>{{ m.role }}
{{ m.content.strip() }}{{ ' ' ~ loop.index ~ '/' ~ loop.length }}<|im_end|>
{% endif -%}{%- endfor -%}
{{ show({'a': [1, 2], 'b': {'c': 'd'}}) }} n={{ ns.n }} {{ dict(x=1)|tojson }} \
{{ (tools or [])|length }} {{ ['a', 'b']|join(', ') }} {{ ', '.join(['c', 'd']) }}
{%- for item in [[1, [2, [3]]]] recursive %}<{{ item if item is number else loop(item) }}>\
{% endfor %} {{ '%s-%d'|format('a', 3) }} {{ 2 ** 10 }} {{ 'ab' * 3 }} {{ bos_token }}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_templates_render_as_transformers_renders_them(own_tokenizer, default_model_path):
    conversations = [
        [{"role": "user", "content": "Hi there"}],
        [
            {"role": "system", "content": "Be brief"},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": " Hello "},
            {"role": "user", "content": "Again"},
        ],
    ]
    tool_list = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    default = transformers.AutoTokenizer.from_pretrained(default_model_path).chat_template
    for template in (default, HERMES_TEMPLATE, FANCY):
        own_tokenizer.chat_template = template
        for messages in conversations:
            for generation_prompt in (False, True):
                for tool_arg in (None, tool_list):
                    ours = template_render.render(
                        own_tokenizer, messages, tool_arg, generation_prompt
                    )
                    theirs = own_tokenizer.apply_chat_template(
                        messages, tools=tool_arg, add_generation_prompt=generation_prompt,
                        tokenize=False,
                    )  # fmt: skip
                    assert ours == theirs


# Renders like ChatML, but a conversation whose last message is "loop" runs without end:
# start-up's probes pass, a request can meet it.
LOOPS_ON_REQUEST = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if messages[-1].content == 'loop' %}{% for i in range(100000) %}"
    "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ALWAYS_LOOPS = HOSTILE["nested loops"][0]


def _with_template(model: Path, template: str) -> Path:
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def test_a_template_that_always_loops_is_refused_at_load(
    tiny_model_copy, own_tokenizer, monkeypatch
):
    steps_bound_first(monkeypatch)
    model = _with_template(tiny_model_copy, ALWAYS_LOOPS)
    with pytest.raises(ValueError, match="cannot load the tokenizer.*more than 1,000,000 steps"):
        load_tokenizer(model)
    # The server's own probes at start-up refuse it too.
    own_tokenizer.chat_template = ALWAYS_LOOPS + "<tool_call>"
    with pytest.raises(TemplateLimitError):
        ChatTemplate.from_tokenizer(own_tokenizer)
    with pytest.raises(TemplateLimitError):
        tools.template_renders_tools(own_tokenizer)


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_the_cli_refuses_a_template_that_always_loops(tiny_model_copy, command):
    model = _with_template(tiny_model_copy, ALWAYS_LOOPS)
    args = ["hi", "--chat"] if command == "generate" else ["--port", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "braid.runtime.cli", command, *args, "--model", str(model)]
        + ["--device", "cpu", "--dtype", "float32"],
        capture_output=True,
        text=True,
        timeout=120,  # a hang, as before, fails here
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "braid: error: cannot load the tokenizer" in done.stderr
    # The step bound, or on a loaded machine the time bound first: refused either way.
    assert re.search(r"more than (1,000,000 steps|2 s)", done.stderr), done.stderr[-2000:]


def test_a_request_whose_rendering_runs_without_end_gets_a_400(tiny_model_copy, monkeypatch):
    from braid.runtime import Engine

    steps_bound_first(monkeypatch)
    model = _with_template(tiny_model_copy, LOOPS_ON_REQUEST)
    engine = Engine(model=str(model), device="cpu", dtype="float32", max_kv_tokens=2048)
    server = LiveServer(engine)
    try:
        url = server.url + "/v1/chat/completions"
        looping = {"messages": [{"role": "user", "content": "loop"}], "max_tokens": 2}
        r = httpx.post(url, json=looping, timeout=60)  # a hang, as before, fails here
        assert r.status_code == 400, r.text
        assert "more than 1,000,000 steps" in r.json()["error"]["message"]
        fine = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        r = httpx.post(url, json=fine, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        server.stop()
        engine.shutdown()
