"""Cases several test files share (tests import it by name, as conftest): a Hermes-style tool
template, a schema and a regex, a prompt and transformers' greedy reference."""

import torch
import transformers

# A Hermes-style template (the format Qwen2.5's and Qwen3's use), written for these tests.
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
Call with <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}{%- for message in messages %}{%- if message.role == 'user' or (message.role == \
'assistant' and not message.tool_calls) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}{% if not loop.first or \
message.content %}
{% endif %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}{% if loop.first or messages[loop.index0 - 1].role != 'tool' \
%}<|im_start|>user{% endif %}
<tool_response>
{{ message.content }}
</tool_response>{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}{% endif %}{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
}
PHONE = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"

PROMPT = "The quick brown fox"


def reference_greedy(path, ids: list[int], n: int) -> list[int]:
    """Greedy decoding with transformers' model, one full forward per token."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(ref(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]
