"""SGLang idioms that its own programs lean on, with `import braid as sgl` on the tiny model:
its cot_decoding example (the next token's top-k from a gen of max_tokens=0, `str(state)`),
its test_stream_logprobs (streamed pieces with their own logprobs, none empty),
RuntimeEndpoint.cache_prefix. Results are checked against transformers' distribution of the
same model and against the engine run directly."""

from __future__ import annotations

import asyncio
from math import exp

import httpx
import pytest
import torch
import transformers
from conftest import LiveServer

import braid as sgl
from braid.interpreter.streamed_text import PieceBuffer
from braid.runtime import Engine, SamplingParams

TOP_K = 3


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    """A tiny-model engine, the default backend while this module runs."""
    from braid.interpreter import backend as backends

    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=8192)
    previous = backends._default
    sgl.set_default_backend(engine)
    yield engine
    sgl.set_default_backend(previous)
    engine.shutdown()


@pytest.fixture(scope="module")
def next_token_logprobs(tiny_model_path):
    """transformers' logprobs of every token after the given ids, under the tiny model."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)

    return logprobs


# SGLang's examples/frontend_language/usage/cot_decoding.py, on a small budget, keeping what it
# reads back: the paths, their probability disparity, the answer spans and the texts.
@sgl.function
def cot_decoding(s, question, get_top_k, is_chat_model):
    if is_chat_model:
        s += sgl.user("Question: " + question + "\nAnswer:")
        s += sgl.assistant_begin()
    else:
        s += "Question: " + question + "\nAnswer:"
    step_0 = s.fork(1)[0]
    forks = s.fork(get_top_k)
    answer_forks = s.fork(get_top_k)
    step_0 += sgl.gen(
        "get_top_k",
        max_tokens=0,
        return_logprob=True,
        top_logprobs_num=get_top_k,
        return_text_in_logprobs=True,
    )
    logprobs = step_0.get_meta_info("get_top_k")["output_top_logprobs"][0]
    paths = []
    for idx, (f, token) in enumerate(zip(forks, logprobs, strict=True)):
        logprob, token_id, text = token
        f += text
        f += sgl.gen(
            "answer",
            temperature=0,
            max_tokens=6,
            return_logprob=True,
            top_logprobs_num=2,
            return_text_in_logprobs=True,
        )
        tops = f.get_meta_info("answer")["output_top_logprobs"]
        x1s = [exp(xt[0][0]) for xt in tops]
        x2s = [exp(xt[1][0]) for xt in tops]
        delta = (sum(x1s) - sum(x2s)) / len(x1s)
        answer_forks[idx] += text + f["answer"] + "\nSo the answer is"
        answer_forks[idx] += sgl.gen("answer_span", temperature=0, max_tokens=4)
        generated_text = str(answer_forks[idx])[len("ProgramState(") : -1]
        paths.append((text, exp(logprob), delta, generated_text))
    return step_0, forks, answer_forks, paths


def test_cot_decoding_example(engine, next_token_logprobs):
    state = cot_decoding.run(
        question="How many eggs in 4 weeks?", get_top_k=TOP_K, is_chat_model=True
    )
    assert state.error is None
    step_0, forks, answer_forks, paths = state.ret_value
    info = step_0.get_meta_info("get_top_k")
    assert info["completion_tokens"] == 0 and info["output_token_logprobs"] == []
    [top] = info["output_top_logprobs"]
    assert len(top) == TOP_K
    # The k most likely tokens after the prompt, best first, with transformers' logprobs.
    prompt = step_0.text()  # the gen wrote nothing
    reference = next_token_logprobs(engine.encode(prompt)).topk(TOP_K)
    assert [t for _, t, _ in top] == reference.indices.tolist()
    assert [lp for lp, _, _ in top] == pytest.approx(reference.values.tolist(), abs=1e-4)
    assert [text for _, _, text in top] == [engine.tokenizer.decode([t]) for _, t, _ in top]
    # As a one-token gen reports its first token's alternatives.
    one = engine.generate(prompt, SamplingParams(max_tokens=1, top_logprobs=TOP_K, temperature=0))
    assert [t for _, t, _ in top] == list(one.meta["top_logprobs"][0])
    for (lp, _, text), f, answer_fork, path in zip(top, forks, answer_forks, paths, strict=True):
        # Each path goes on greedily from its first token (healing it, as a gen does).
        healed = SamplingParams(temperature=0, max_tokens=6, token_healing=True)
        direct = engine.generate(prompt + text, healed)
        assert f["answer"] == direct.text
        tops = f.get_meta_info("answer")["output_top_logprobs"]
        assert len(tops) == f.get_meta_info("answer")["completion_tokens"]
        assert all(len(t) == 2 and t[0][0] >= t[1][0] for t in tops)
        assert path[0] == text and path[1] == pytest.approx(exp(lp))
        assert 0 <= path[2] <= 1
        # str(state) is SGLang's "ProgramState(<text>)": the example cuts the text out of it.
        assert path[3] == answer_fork.text()
        assert path[3].endswith(
            text + f["answer"] + "\nSo the answer is" + answer_fork["answer_span"]
        )


def test_str_of_a_state_is_sglangs(engine):
    @sgl.function
    def hello(s):
        s += "Hello," + sgl.gen("rest", max_tokens=3, temperature=0)

    state = hello.run()
    assert str(state) == f"ProgramState({state.text()})"
    assert state.text() == "Hello," + state["rest"]


# SGLang's python/sglang/test/test_programs.py test_stream_logprobs, on a small budget.
@sgl.function
def qa(s, question):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", return_logprob=True))


def test_stream_logprobs(engine):
    async def collect_chunks():
        ret = qa(
            question="Compose a travel blog post.", stream=True, temperature=0, max_new_tokens=12
        )
        chunks = [c async for c in ret.text_async_iter("answer", return_meta_data=True)]
        return ret, chunks

    ret, chunks = asyncio.run(collect_chunks())
    assert len(chunks) > 0
    prev_completion_tokens = 0
    prev_output_token_logprobs_length = 0
    for chunk_text, meta_info in chunks:
        assert chunk_text
        assert "output_token_logprobs" in meta_info
        assert "output_token_logprobs_length" in meta_info
        completion_tokens = meta_info["completion_tokens"]
        output_token_logprobs_length = meta_info["output_token_logprobs_length"]
        chunk_output_token_logprobs = meta_info["output_token_logprobs"]
        assert completion_tokens == output_token_logprobs_length
        assert len(chunk_output_token_logprobs) == completion_tokens - prev_completion_tokens
        assert len(chunk_output_token_logprobs) == (
            output_token_logprobs_length - prev_output_token_logprobs_length
        )
        prev_completion_tokens = completion_tokens
        prev_output_token_logprobs_length = output_token_logprobs_length
    # The pieces add up to the gen: its text, and its listing token by token.
    whole = ret.get_meta_info("answer")
    assert "".join(text for text, _ in chunks) == ret["answer"]
    assert [e for _, m in chunks for e in m["output_token_logprobs"]] == whole[
        "output_token_logprobs"
    ]
    assert chunks[-1][1]["finish_reason"] == whole["finish_reason"]
    prompt = ret.text()[: -len(ret["answer"]) - len("<|im_end|>\n")]
    direct = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=12, logprobs=True))
    assert direct.text == ret["answer"]
    assert [t for _, t, _ in whole["output_token_logprobs"]] == direct.token_ids
    assert [lp for lp, _, _ in whole["output_token_logprobs"]] == pytest.approx(
        direct.meta["logprobs"], abs=1e-5
    )


def test_a_token_without_text_goes_with_the_next_piece():
    # A character split over two tokens: the first writes no text, so no piece of its own.
    pieces = PieceBuffer(with_logprobs=True)
    assert pieces.add("", [7], [-0.5], [{7: -0.5, 8: -1.0}]) is None
    piece = pieces.add("é", [9], [-0.25], [{9: -0.25}])
    assert piece == "é" and piece.token_ids == [7, 9]
    assert piece.logprobs == [-0.5, -0.25] and piece.top_logprobs == [
        {7: -0.5, 8: -1.0},
        {9: -0.25},
    ]
    assert pieces.add("x", [3], None, None).token_ids == [3]  # the buffer starts again


def test_text_iter_yields_no_empty_piece(engine):
    @sgl.function
    def parts(s):
        s += ""  # appended text that is empty is not a piece of the stream
        s += "A:" + sgl.gen("a", max_tokens=4, temperature=0) + ""

    state = parts.run(stream=True)
    pieces = list(state.text_iter())
    assert all(pieces) and "".join(pieces) == state.text()
    assert all(list(parts.run(stream=True).text_iter("a")))


@pytest.fixture(scope="module")
def server(engine):
    server = LiveServer(engine)
    yield server
    server.stop()


def test_cache_prefix_has_the_server_cache_it(engine, server):
    endpoint = sgl.RuntimeEndpoint(server.url)
    prefix = "A long shared instruction that many prompts begin with. " * 4
    ask = {"text": prefix + "Then a question.", "sampling_params": {"max_new_tokens": 1}}

    def cached_tokens() -> int:
        r = httpx.post(server.url + "/generate", json=ask)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]["cached_tokens"]

    endpoint.flush_cache()
    assert cached_tokens() == 0  # nothing cached: the reference
    endpoint.flush_cache()
    endpoint.cache_prefix(prefix)
    # The prompt finds the prefix's tokens (the last may merge with what follows it).
    assert cached_tokens() >= len(engine.encode(prefix)) - 1


def test_select_takes_sglangs_positional_temperature(engine):
    choices = ["yes", "no", "maybe"]

    @sgl.function
    def pick(s):
        s += "Is the sky blue? Answer:" + sgl.select("plain", choices, 0.0)
        s += " Again:" + sgl.select("greedy", choices, 0.0, sgl.greedy_token_selection)

    @sgl.function
    def pick_by_keywords(s):
        s += "Is the sky blue? Answer:" + sgl.select("plain", choices, temperature=0.0)
        s += " Again:" + sgl.select("greedy", choices, choices_method=sgl.greedy_token_selection)

    state, reference = pick.run(), pick_by_keywords.run()
    assert state.error is None and state.text() == reference.text()
    assert state.get_meta_info("greedy") == reference.get_meta_info("greedy")
    with pytest.raises(ValueError, match="temperature must be 0"):
        sgl.select("x", choices, 0.5)


def test_next_token_top_k_through_a_server(engine, server, next_token_logprobs):
    @sgl.function
    def step_0(s):
        s += "Question: How many eggs?\nAnswer:"
        s += sgl.gen("top", max_tokens=0, return_logprob=True, top_logprobs_num=TOP_K)

    state = step_0.run(backend=sgl.RuntimeEndpoint(server.url))
    [top] = state.get_meta_info("top")["output_top_logprobs"]
    reference = next_token_logprobs(engine.encode("Question: How many eggs?\nAnswer:")).topk(TOP_K)
    assert [t for _, t, _ in top] == reference.indices.tolist()
    assert [lp for lp, _, _ in top] == pytest.approx(reference.values.tolist(), abs=1e-4)
