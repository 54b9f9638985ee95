"""How a program's assistant message opens, with the real chat templates of Qwen3,
DeepSeek-R1, SmolLM3 and GPT-OSS (tests/reasoning_models.py): where a gen writes its first
text, as transformers' apply_chat_template writes the generation prompt (thinking on where
the template's default is; `thinking=False` as enable_thinking=False); where the program
writes it, as the template renders that assistant turn in a history."""

from __future__ import annotations

import pytest
import transformers
from backend_doubles import ScriptedBase
from reasoning_models import FAMILIES, QUESTION, family_tokenizer, render

from braid import assistant, gen, program, select, user
from braid.runtime.protocol import GenerateOutput
from braid.runtime.text.chat_template import ChatTemplate
from braid.runtime.text.generation_openings import GenerationOpenings

REPLY = "Yes."


class TemplateBackend(ScriptedBase):
    """A model that answers REPLY to every gen and scores "yes" best, with a family's chat
    template; `openings=False` knows no generation prompt (as a RemoteBackend)."""

    def __init__(self, tokenizer, openings: bool = True) -> None:
        self.chat_template = ChatTemplate.from_tokenizer(tokenizer)
        self._openings = GenerationOpenings.from_tokenizer(tokenizer) if openings else None
        self.prompts: list[str] = []

    @property
    def generation_openings(self) -> GenerationOpenings | None:
        return self._openings

    async def generate(self, prompt, params, on_text, lora=None, program=None):
        self.prompts.append(prompt)
        on_text(REPLY)
        return GenerateOutput(REPLY, [], "stop", {})

    async def score(self, prefix, continuations, lora=None):
        return [[0.0] if c == "yes" else [-1.0] for c in continuations]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, default_model_path):
    return {
        family: transformers.AutoTokenizer.from_pretrained(
            family_tokenizer(family, default_model_path, tmp_path_factory.mktemp(family))
        )
        for family in FAMILIES
    }


@program
def answered(s, thinking=None):
    s += user(QUESTION[0]["content"])
    s += assistant(gen("answer"), thinking=thinking)


@program
def answered_in_a_block(s):
    s += user(QUESTION[0]["content"])
    with s.assistant():
        with s.var_scope("scoped"):
            s += gen("answer")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_gen_opens_its_message_as_the_generation_prompt(tokenizers, family):
    tokenizer = tokenizers[family]
    generation_prompt = render(tokenizer, QUESTION, add_generation_prompt=True)
    for run in (answered, answered_in_a_block):
        backend = TemplateBackend(tokenizer)
        state = run.run(backend=backend)
        assert backend.prompts == [generation_prompt]
        assert state.text() == generation_prompt + REPLY + backend.chat_template.end("assistant")
        assert state.messages() == [*QUESTION, {"role": "assistant", "content": REPLY}]
    assert state["scoped"] == REPLY  # the opening is not the message's text


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_thinking_false_opens_as_enable_thinking_false_does(tokenizers, family):
    tokenizer = tokenizers[family]
    backend = TemplateBackend(tokenizer)
    answered.run(backend=backend, thinking=False)
    off = render(tokenizer, QUESTION, add_generation_prompt=True, enable_thinking=False)
    if family == "qwen3":
        assert backend.prompts == [off]
    else:  # SmolLM3 also says /no_think in its system turn, which the program wrote before
        history = render(tokenizer, QUESTION, enable_thinking=False)
        assert backend.prompts[0].endswith(off.removeprefix(history))
        assert off.removeprefix(history) == "<|im_start|>assistant\n<think>\n\n</think>\n"
    backend = TemplateBackend(tokenizer)
    answered.run(backend=backend, thinking=True)
    assert backend.prompts == [render(tokenizer, QUESTION, add_generation_prompt=True)]


@pytest.mark.parametrize("family", ["r1", "gpt_oss"])
def test_thinking_false_where_the_template_has_no_switch_raises(tokenizers, family):
    with pytest.raises(ValueError, match=r"thinking=False\): the model's chat template has no"):
        answered.run(backend=TemplateBackend(tokenizers[family]), thinking=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_program_written_answer_opens_as_a_history_turn(tokenizers, family):
    tokenizer = tokenizers[family]
    conversation = [*QUESTION, {"role": "assistant", "content": REPLY}]

    @program
    def few_shot(s):
        s += user(QUESTION[0]["content"])
        s += assistant(REPLY)

    @program
    def chosen(s):
        s += user(QUESTION[0]["content"])
        with s.assistant():
            s += select("choice", ["yes", "no"])

    assert few_shot.run(backend=TemplateBackend(tokenizer)).text() == render(
        tokenizer, conversation
    )
    state = chosen.run(backend=TemplateBackend(tokenizer))
    assert state.text() == render(tokenizer, [*QUESTION, {"role": "assistant", "content": "yes"}])


def test_a_fork_inside_the_message_shares_one_opening(tokenizers):
    tokenizer = tokenizers["r1"]

    @program
    def forked(s):
        s += user(QUESTION[0]["content"])
        with s.assistant():
            forks = s.fork(2)
            forks += gen("answer")
            forks.join("concate_and_append")

    backend = TemplateBackend(tokenizer)
    state = forked.run(backend=backend)
    generation_prompt = render(tokenizer, QUESTION, add_generation_prompt=True)
    assert backend.prompts == 2 * [generation_prompt]
    assert state.text() == generation_prompt + 2 * REPLY + backend.chat_template.end("assistant")


def test_a_backend_without_generation_prompts_opens_as_a_history_turn(tokenizers):
    tokenizer = tokenizers["qwen3"]
    backend = TemplateBackend(tokenizer, openings=False)
    answered.run(backend=backend)
    assert backend.prompts == [
        render(tokenizer, QUESTION, add_generation_prompt=True, enable_thinking=False)
    ]  # Qwen3's history turn: no thought
    with pytest.raises(NotImplementedError, match="TemplateBackend cannot tell how"):
        answered.run(backend=backend, thinking=False)


def test_thinking_needs_a_message_before_the_assistant_one(tokenizers):
    @program
    def opens(s):
        s += assistant(gen("answer"), thinking=False)

    with pytest.raises(ValueError, match="opens the conversation has no generation prompt"):
        opens.run(backend=TemplateBackend(tokenizers["qwen3"]))
