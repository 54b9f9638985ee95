"""Messages framed by ChatTemplate's pieces equal the tokenizer's own rendering."""

from __future__ import annotations

import copy

import pytest

from braid.interpreter import ChatTemplate

LLAMA3_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
)
# A first system message gets a preamble a later one does not (as Llama 3.1's date line).
SYSTEM_PREAMBLE = (
    "{% for m in messages %}{% if loop.first and m['role'] == 'system' %}"
    "<|system|>Today: Monday.\n{{ m['content'] }}<|end|>"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
)
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('system messages are not supported') }}{% endif %}"
    "{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}</s>{% endif %}{% endfor %}"
)
CONVERSATIONS = [
    [("system", "Be brief."), ("user", "Hi!"), ("assistant", "Hello.")],
    [("user", "Hi!"), ("assistant", "Hello."), ("user", "Bye"), ("assistant", "Ciao")],
    [("assistant", "I start."), ("user", "ok")],
]


def _render(template: ChatTemplate, conversation) -> str:
    return "".join(
        template.begin(role, first=i == 0) + content + template.end(role)
        for i, (role, content) in enumerate(conversation)
    )


def _with_template(tokenizer, text: str | None, add_bos: bool = False):
    tok = copy.deepcopy(tokenizer)
    if text is not None:
        tok.chat_template = text
    tok.add_bos_token = add_bos
    return tok


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_default_template_pieces_render_like_the_tokenizer(tokenizer, conversation):
    template = ChatTemplate.from_tokenizer(tokenizer)
    messages = [{"role": r, "content": c} for r, c in conversation]
    assert _render(template, conversation) == tokenizer.apply_chat_template(
        messages, tokenize=False
    )


def test_a_default_system_prompt_opens_only_a_conversation_without_one(tokenizer):
    template = ChatTemplate.from_tokenizer(tokenizer)
    assert "You are a helpful AI assistant" in template.begin("user", first=True)
    assert template.begin("user", first=False) == "<|im_start|>user\n"
    assert template.begin("system", first=True) == "<|im_start|>system\n"


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_a_template_that_writes_bos_leaves_it_to_the_tokenizer(tokenizer, conversation):
    tok = _with_template(tokenizer, LLAMA3_LIKE, add_bos=True)
    assert tok.encode("a")[0] == tok.bos_token_id
    template = ChatTemplate.from_tokenizer(tok)
    messages = [{"role": r, "content": c} for r, c in conversation]
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert rendered.startswith(tok.bos_token)
    assert _render(template, conversation) == rendered.removeprefix(tok.bos_token)


def test_a_later_system_message_has_its_own_opening(tokenizer):
    tok = _with_template(tokenizer, SYSTEM_PREAMBLE)
    template = ChatTemplate.from_tokenizer(tok)
    conversation = [("system", "Be brief."), ("user", "Hi"), ("system", "Now French.")]
    messages = [{"role": r, "content": c} for r, c in conversation]
    assert _render(template, conversation) == tok.apply_chat_template(messages, tokenize=False)


def test_a_role_the_template_refuses_fails_when_used(tokenizer):
    template = ChatTemplate.from_tokenizer(_with_template(tokenizer, NO_SYSTEM))
    conversation = [("user", "Hi"), ("assistant", "Yo"), ("user", "Bye")]
    messages = [{"role": r, "content": c} for r, c in conversation]
    assert _render(template, conversation) == tokenizer.apply_chat_template(
        messages, tokenize=False, chat_template=NO_SYSTEM
    )
    with pytest.raises(ValueError, match="cannot render a system message"):
        template.begin("system", first=True)


def test_no_template_is_a_clear_error(tokenizer):
    tok = _with_template(tokenizer, None)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatTemplate.from_tokenizer(tok)
