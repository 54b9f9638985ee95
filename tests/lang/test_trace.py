"""The trace view: a traced run's HTML loaded in headless Chromium shows each state's text as
the run wrote it, coloured by the origin the runtime recorded (forced tokens, cache hits),
with each token's logprob on hover, each select's scores and each gen's counts; an untraced
run keeps no record."""

from __future__ import annotations

import re

import pytest
from browser import browser_page
from conftest import LiveServer

from braid import gen, program, select
from braid.interpreter import LocalBackend, RemoteBackend
from braid.runtime import Engine

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def backend(tiny_model_path):
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    yield LocalBackend(engine)
    engine.shutdown()


@program
def planner(s):
    s += "Pick a colour and a number.\nColour: " + select("colour", ["red", "green", "blue"])
    # Unhealed: the hover test reads the regex's own first mask.
    s += "\nNumber: " + gen("num", regex=r"[0-9]{2,4}", temperature=0, token_healing=False)
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"\nIdea {i}: " + gen("idea", max_tokens=5, temperature=0)
    forks.join()
    # Compact and unhealed: the schema's required key is then forced from the first token.
    s += "\nJSON: " + gen(
        "js", json_schema=SCHEMA, max_tokens=12, temperature=0, json_compact=True,
        token_healing=False,
    )  # fmt: skip
    return forks


@pytest.fixture(scope="module")
def traced(backend, tmp_path_factory):
    state = planner.run(backend=backend, trace=True)
    path = tmp_path_factory.mktemp("trace") / "trace.html"
    state.trace().to_html(path)
    return state, path


def test_untraced_run_keeps_no_record(backend, monkeypatch):
    monkeypatch.delenv("BRAID_TRACE", raising=False)
    state = planner.run(backend=backend)
    assert "trace" not in state.meta("num") and "logprobs" not in state.meta("num")
    with pytest.raises(ValueError, match="without tracing"):
        state.trace()
    monkeypatch.setenv("BRAID_TRACE", "1")
    assert "trace" in planner.run(backend=backend).meta("num")


def test_page_shows_each_state_text_by_origin(traced, backend):
    state, path = traced
    forks = state.ret_value
    tokenizer = backend.engine.tokenizer
    with browser_page() as page:
        page.goto(path.as_uri())
        # What a person reads in each state's box is the state's own text.
        assert page.locator("#state-0 > .text").text_content() == state.text()
        for i, fork in enumerate(forks):
            own = page.locator(f"#state-{i + 1} > .text").text_content()
            assert fork.text().endswith(own) and own.startswith(f"\nIdea {i}: ")
            assert own.endswith(fork["idea"])

        for name in ("num", "js"):
            meta = state.meta(name)
            spans = page.locator(f'#state-0 > .text span.tok[data-gen="{name}"]')
            origins = spans.evaluate_all("els => els.map(e => e.dataset.origin)")
            # One span per token the engine produced, coloured as the engine recorded it.
            assert len(origins) == len(meta["token_ids"])
            assert origins == ["forced" if f else "generated" for f in meta["trace"]["forced"]]
            texts = spans.evaluate_all("els => els.map(e => e.textContent)")
            assert "".join(texts) == meta["text"]
        # The schema's required key is forced text: `{"a":` comes from the grammar, unsampled.
        js = state.meta("js")
        forced_ids = [t for t, f in zip(js["token_ids"], js["trace"]["forced"], strict=True) if f]
        assert tokenizer.decode(forced_ids).startswith('{"a":')

        # The prefix cache served the start of num's prompt (the select scored it first): the
        # text shown as cached is exactly what its cached tokens spell (the select's choice
        # among it keeps its own colour), and the rest of that prompt is computed.
        num = state.meta("num")
        assert num["cached_tokens"] > 0
        prompt = state.text()[: state.text().index("\nNumber: ") + len("\nNumber: ")]
        offsets = tokenizer(prompt, return_offsets_mapping=True)["offset_mapping"]
        cached_chars = offsets[num["cached_tokens"] - 1][1]
        segments = page.locator("#state-0 > .text > span").evaluate_all(
            "els => els.map(e => [e.dataset.origin, e.textContent])"
        )
        origin_of = [origin for origin, text in segments for _ in text]
        assert set(origin_of[:cached_chars]) == {"cached", "selected"}
        assert set(origin_of[cached_chars : len(prompt)]) == {"prompt"}


def test_hover_shows_logprob_and_mask(traced, backend):
    state, path = traced
    num = state.meta("num")
    vocab = backend.token_texts(list(range(len(backend.engine.tokenizer))))
    # The first token of [0-9]{2,4} may be any token of 1 to 4 digits, and nothing else.
    first_allowed = sum(bool(re.fullmatch(r"[0-9]{1,4}", t)) for t in vocab)
    with browser_page() as page:
        page.goto(path.as_uri())
        for i in range(len(num["token_ids"])):
            page.locator(f'span.tok[data-gen="num"][data-i="{i}"]').hover()
            tip = page.locator("#tip")
            assert tip.is_visible()
            assert f"logprob {num['logprobs'][i]:.4f}" in tip.text_content()
            allowed = num["trace"]["allowed"][i]
            assert f"allowed {allowed} tokens" in tip.text_content()
        assert num["trace"]["allowed"][0] == first_allowed


def test_select_scores_and_gen_counts(traced):
    state, path = traced
    colour = state.meta("colour")
    with browser_page() as page:
        page.goto(path.as_uri())
        card = page.locator('.op.select[data-name="colour"]')
        assert "token_length_normalized" in card.text_content()
        rows = card.locator("tr").all_text_contents()
        scores = zip(colour["choices"], colour["scores"], strict=True)
        assert rows == [f"{choice}{score:.4f}" for choice, score in scores]
        assert card.locator("tr.chosen").text_content().startswith(state["colour"])
        for name in ("num", "js"):
            meta = state.meta(name)
            text = page.locator(f'#state-0 > .ops > .op.gen[data-name="{name}"]').text_content()
            assert (
                f"{meta['completion_tokens']} tokens ({sum(meta['trace']['forced'])} forced)"
                in text
            )
            computed = meta["prompt_tokens"] - meta["cached_tokens"]
            assert f"prefill: {meta['cached_tokens']} cached + {computed} computed" in text
        # The fork's branches hang under the fork, and the join names them.
        assert page.locator("#state-0 .op.fork + .branches > .state").count() == 2
        assert "join of states 1, 2" in page.locator("#state-0 .op.join").text_content()


def test_remote_trace_shows_text_selects_and_counts(backend, tmp_path):
    server = LiveServer(backend.engine)
    try:
        state = planner.run(backend=RemoteBackend(server.url), trace=True)
        trace = state.trace()
    finally:
        server.stop()
    root = trace.to_dict()["states"][0]
    gens = [e for e in root["events"] if e["kind"] == "gen"]
    assert [g["name"] for g in gens] == ["num", "js"]
    for g in gens:
        assert g["completion_tokens"] == len(state.meta(g["name"])["token_ids"])
    path = tmp_path / "remote.html"
    trace.to_html(path)
    with browser_page() as page:
        page.goto(path.as_uri())
        assert page.locator("#state-0 > .text").text_content() == state.text()
        generated = page.locator('#state-0 > .text > span[data-origin="generated"]')
        assert state["num"] in generated.all_text_contents()
        assert page.locator('.op.select[data-name="colour"] tr.chosen').count() == 1
