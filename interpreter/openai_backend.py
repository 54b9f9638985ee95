"""OpenAIBackend: programs run on any OpenAI-compatible API.

Text goes to /completions. Chat roles need the model's template to become text; without one
(`chat_template=None`, as with a hosted chat model) roles are written with markers that
`generate` parses back into messages for /chat/completions, so a gen must then open an
assistant message. Constraints go as the endpoint's own fields: a JSON schema as
`response_format`, regex/choices/grammar as extra fields (braid, SGLang and vLLM-style
servers read them; others answer 400, which raises). `select` needs prompt logprobs:
/completions with echo, logprobs and max_tokens 0; an endpoint without them raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from braid.interpreter.backend import TextOnlyBackend
from braid.interpreter.http import HttpClient
from braid.runtime.protocol import GenerateOutput, SamplingParams
from braid.runtime.text.chat_template import ROLES, ChatTemplate

# Role markers for endpoints that take messages; NUL never occurs in program text.
_MARKERS = ChatTemplate(
    first_opening={r: f"\x00<{r}>\x00" for r in ROLES},
    opening={r: f"\x00<{r}>\x00" for r in ROLES},
    closing={r: f"\x00</{r}>\x00" for r in ROLES},
)
_MESSAGE = re.compile(r"\x00<(\w+)>\x00(.*?)(\x00</\1>\x00|\Z)", re.DOTALL)

# Sampling fields OpenAI itself defines; the others are sent only when not at their default,
# so an endpoint that does not know them still accepts a request that does not use them.
_OPENAI_FIELDS = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty")
_EXTRA_FIELDS = ("top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos")
_EXTRA_FIELDS += ("stop_token_ids", "stop_regex", "regex", "choices", "grammar", "close_documents")


class OpenAIBackend(TextOnlyBackend):
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        chat_template: ChatTemplate | None = None,
        timeout: float = 600.0,
    ) -> None:
        """`base_url` ends before /completions (e.g. http://host:port/v1). Give the model's
        `chat_template` (ChatTemplate.from_tokenizer) to send chats as text completions."""
        self.http = HttpClient(base_url, api_key, timeout)
        self.model = model
        self.chat_template = chat_template or _MARKERS

    async def generate(
        self,
        prompt: str,
        params: SamplingParams,
        on_text: Callable[[str], None],
        lora: str | None = None,
        program: str | None = None,
    ) -> GenerateOutput:
        """`lora`: an adapter the server lists as a model of its own (braid serve and vLLM
        do), asked for by that name. `program` is ignored: the API keeps no leases."""
        if params.n != 1 or params.prompt_logprobs_from is not None:
            raise ValueError("OpenAIBackend generates one sample without prompt logprobs")
        body = {"model": lora or self.model, "stream": True}
        body["stream_options"] = {"include_usage": True}
        body |= _sampling_fields(params)
        messages = _messages(prompt) if self.chat_template is _MARKERS else None
        if messages is None:
            path = "/completions"
            body |= {"prompt": prompt, "max_tokens": params.max_tokens}
            if params.wants_logprobs:
                body["logprobs"] = params.top_logprobs
        else:
            path = "/chat/completions"
            body |= {"messages": messages, "max_completion_tokens": params.max_tokens}
            if params.wants_logprobs:
                body |= {"logprobs": True, "top_logprobs": params.top_logprobs}
        text, logprobs, finish, usage = [], [], None, {}
        async for event in self.http.events(path, body):
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                piece = choice["text"] if "text" in choice else choice["delta"].get("content")
                if piece:
                    on_text(piece)
                    text.append(piece)
                logprobs += _token_logprobs(choice.get("logprobs"))
                finish = choice.get("finish_reason") or finish
        meta = {
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "completion_tokens": usage.get("completion_tokens"),
        }
        if params.wants_logprobs:
            meta["logprobs"] = logprobs
        return GenerateOutput("".join(text), [], finish or "stop", meta)

    async def score(
        self, prefix: str, continuations: list[str], lora: str | None = None
    ) -> list[list[float]]:
        """Each continuation scored from the first token that reaches past the prefix, the
        earliest such position over all of them (the span a local engine scores, found by
        text offsets since the endpoint's tokenizer is not at hand)."""
        if self.chat_template is _MARKERS and "\x00<" in prefix:
            raise ValueError(
                "select inside chat roles needs the model's template as text: create the "
                "OpenAIBackend with chat_template=ChatTemplate.from_tokenizer(tokenizer)"
            )
        texts = [prefix + c for c in continuations]
        body = {"model": lora or self.model, "prompt": texts, "max_tokens": 0, "echo": True}
        body |= {"logprobs": 0, "temperature": 0}
        try:
            reply = await self.http.post("/completions", body)
            listings = sorted(reply["choices"], key=lambda c: c["index"])
            listings = [c["logprobs"] for c in listings]
            spans = [_listing(lp, len(t)) for lp, t in zip(listings, texts, strict=True)]
        except (ValueError, RuntimeError, KeyError, TypeError) as e:
            raise RuntimeError(
                f"select needs prompt logprobs, which {self.http.base_url}/completions did not "
                f"give (echo=true, logprobs=0, max_tokens=0): {e}"
            ) from e
        start = min(_first_past(offsets, ends, len(prefix)) for offsets, ends, _ in spans)
        out = []
        for offsets, _, lps in spans:
            scored = [lp for off, lp in zip(offsets, lps, strict=True) if off >= start]
            if not scored or any(lp is None for lp in scored):
                raise ValueError("select needs text before the choices to score them against")
            out.append(scored)
        return out

    def flush_cache(self) -> None:
        raise NotImplementedError(
            "OpenAIBackend cannot flush_cache: an OpenAI-compatible API has no call for it "
            "(a LocalBackend or a RemoteBackend can)"
        )

    def get_server_info(self) -> dict:
        raise NotImplementedError(
            "OpenAIBackend cannot get_server_info: an OpenAI-compatible API has no call for "
            "it (a LocalBackend or a RemoteBackend can)"
        )


def _sampling_fields(params: SamplingParams) -> dict:
    defaults = SamplingParams()
    fields = {k: getattr(params, k) for k in _OPENAI_FIELDS if getattr(params, k) is not None}
    fields |= {
        k: getattr(params, k) for k in _EXTRA_FIELDS if getattr(params, k) != getattr(defaults, k)
    }
    if params.json_schema is not None:
        schema = params.json_schema
        schema = json.loads(schema) if isinstance(schema, str) else schema
        fields["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    return fields


def _messages(prompt: str) -> list[dict] | None:
    """The marked-up conversation as chat messages, ending where an assistant message opens
    (the gen's place); None for a prompt without roles."""
    if "\x00<" not in prompt:
        return None
    messages, pos, open_role = [], 0, None
    for m in _MESSAGE.finditer(prompt):
        if prompt[pos : m.start()].strip():
            raise ValueError("a chat API takes only messages: put all text inside roles")
        messages.append({"role": m[1], "content": m[2]})
        pos, open_role = m.end(), None if m[3] else m[1]
    if open_role != "assistant" or messages[-1]["content"]:
        raise ValueError(
            "a chat API generates whole assistant messages: put the gen at the start of an "
            "assistant message, or give the OpenAIBackend the model's chat_template"
        )
    return messages[:-1]


def _token_logprobs(listing: dict | None) -> list[float]:
    """Sampled tokens' logprobs from a completions or a chat logprobs object."""
    if not listing:
        return []
    if "content" in listing:
        return [t["logprob"] for t in listing["content"] or []]
    return listing["token_logprobs"]


def _listing(listing: dict, text_len: int) -> tuple[list[int], list[int], list[float | None]]:
    """(offsets, end offsets, logprobs) of an echoed prompt's tokens, none generated."""
    offsets, tokens = listing["text_offset"], listing["tokens"]
    ends = [off + len(tok) for off, tok in zip(offsets, tokens, strict=True)]
    keep = [i for i, off in enumerate(offsets) if off < text_len]
    lps = listing["token_logprobs"]
    return [offsets[i] for i in keep], [ends[i] for i in keep], [lps[i] for i in keep]


def _first_past(offsets: list[int], ends: list[int], prefix_len: int) -> int:
    """The offset of the first token whose text reaches past the prefix."""
    return next(off for off, end in zip(offsets, ends, strict=True) if end > prefix_len)
