"""Wire types of the HTTP APIs and the one place their sampling fields become SamplingParams.

Fields that mean the same on the wire as in SamplingParams (max_tokens, temperature, stop,
seed, regex, ...) are not listed here: `split_sampling` takes them out of the request body
by SamplingParams' own field names and msgspec converts them into it, so the defaults and
the validation are SamplingParams'. Each API's Struct lists only what is its own. The
OpenAI routes take other servers' fields as vLLM and SGLang do: unknown ones are ignored and
named in a response header, known ones braid lacks that would change the reply are a 400
(_UNIMPLEMENTED); SGLang's /generate forbids unknown fields.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Annotated, Any, Literal

import msgspec

from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.protocol.wire_fields import REPORTING_FIELDS, SAMPLING_FIELDS


class BadRequest(ValueError):
    """The request is malformed or asks for something impossible: a 400 with this message."""


class ModelNotFound(LookupError):
    """The request names a model this server does not serve: a 404, as OpenAI answers."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist or you do not have access to it.")


# A request's own prefix-cache namespace (vLLM's `cache_salt`): it shares cached prefixes
# only with requests that give the same salt, so other clients' cached token counts and
# timing tell it nothing of their prompts. Empty is refused, as vLLM refuses it.
CacheSalt = Annotated[str, msgspec.Meta(min_length=1)]
# A thinking budget, in tokens (0: no thought).
Budget = Annotated[int, msgspec.Meta(ge=0)]
# A program state's name on its requests (RemoteBackend's): the server keeps its prefix
# leased between them (runtime/kvcache/leases.py).
ProgramId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


def error_body(status: int, kind: str, message: str, code: str | None = None) -> dict:
    """OpenAI's error shape, which its client turns into an exception with this message;
    `code` is OpenAI's machine-readable code where it has one (e.g. model_not_found), else
    the status."""
    error = {"message": message, "type": kind, "param": None, "code": code or status}
    return {"error": error}


# The routes that answer errors in Anthropic's shape (its Messages API and those under it),
# whose SDK reads no other; OpenAI's error types that Anthropic names otherwise.
ANTHROPIC_PATH = "/v1/messages"
_ANTHROPIC_KINDS = {"overloaded": "overloaded_error", "server_error": "api_error"}


def anthropic_error_body(
    kind: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Anthropic's error shape (`kind`: its error type)."""
    error = {"type": kind, "message": message}
    if details is not None:  # what a client recovers by (a thread rejection's error_code)
        error["details"] = details
    return {"type": "error", "error": error}


def refusal_body(path: str, status: int, kind: str, message: str, code: str | None = None) -> dict:
    """The error body of a refusal made for any route (a guard, the body limit, the API key,
    the app's handlers): Anthropic's shape under ANTHROPIC_PATH, OpenAI's elsewhere."""
    if path.startswith(ANTHROPIC_PATH):
        kind = "not_found_error" if status == 404 else _ANTHROPIC_KINDS.get(kind, kind)
        return anthropic_error_body(kind, message)
    return error_body(status, kind, message, code)


# A \u escape of a high surrogate (after an even run of backslashes: not itself escaped)
# without the low surrogate escape that must follow it.
_LONE_HIGH_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


def decode_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object."""
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        reason = str(e)
        # msgspec says "truncated" of a high surrogate escape with no low one after it.
        if reason == "Input data was truncated" and _LONE_HIGH_SURROGATE.search(body):
            reason = (
                "a \\u escape is a lone UTF-16 surrogate (\\ud800-\\udbff without the low "
                "surrogate escape after it)"
            )
        raise BadRequest(f"the request body is not valid JSON: {reason}") from None
    except RecursionError:  # msgspec's guard against arrays or objects nested thousands deep
        raise BadRequest("the request body nests arrays or objects too deeply") from None
    if not isinstance(obj, dict):
        raise BadRequest("the request body must be a JSON object")
    return obj


# SamplingParams' reasoning fields, which the conversational routes read as fields of their
# own (chat/reasoning_fields.py: the pipeline sets them from the request and the model).
REASONING_FIELDS = frozenset({"reasoning", "thinking_budget", "thinking_budget_mode"})


def split_sampling(
    obj: dict[str, Any], own: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the fields named as in SamplingParams, the rest: with it the fields in `own`, which
    the request reads itself). A null sampling field counts as absent, as OpenAI clients
    send it."""
    taken = SAMPLING_FIELDS - own
    sampling = {k: v for k, v in obj.items() if k in taken and v is not None}
    rest = {k: v for k, v in obj.items() if k not in taken}
    if rest.get("ebnf") is not None:  # SGLang's name, on every route
        if "grammar" in sampling:
            raise BadRequest("ebnf and grammar give the same constraint twice: give one")
        sampling["grammar"] = rest.pop("ebnf")
    return sampling, rest


def convert(obj: Any, kind: type) -> Any:
    """msgspec.convert, with its message (which names the field) as a BadRequest."""
    try:
        return msgspec.convert(obj, kind)
    except (msgspec.ValidationError, ValueError) as e:
        raise BadRequest(str(e)) from None


def sampling_params(fields: dict[str, Any]) -> SamplingParams:
    bias = fields.get("logit_bias")
    if isinstance(bias, dict):  # JSON object keys are strings: the token ids as text
        fields = {**fields, "logit_bias": {_token_id(k): v for k, v in bias.items()}}
    return convert(fields, SamplingParams)


def _token_id(key: Any) -> Any:
    if isinstance(key, str):
        if not re.fullmatch(r"-?[0-9]+", key):
            raise BadRequest(f"logit_bias keys must be token ids (integers); got {key!r}")
        return int(key)
    return key


# ---- OpenAI ---------------------------------------------------------------------------------


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True, rename={"schema_": "schema"}):
    name: str = "response"
    schema_: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # An XGrammar structural tag (SGLang's and vLLM's): its format, or the legacy structures
    # and triggers; grammars/structural_tag.py checks them (the errors name each field).
    format: dict[str, Any] | None = None
    structures: list[Any] | None = None
    triggers: list[Any] | None = None

    def as_sampling(self) -> dict[str, Any]:
        """The constraint it asks for, as SamplingParams fields."""
        tag = {k: getattr(self, k) for k in ("format", "structures", "triggers")}
        tag = {k: v for k, v in tag.items() if v is not None}
        if self.type != "structural_tag" and tag:
            raise BadRequest(f"response_format.{next(iter(tag))} is only for type structural_tag")
        if self.type == "json_object":
            return {"json_schema": {"type": "object"}}
        if self.type == "json_schema":
            if self.json_schema is None or self.json_schema.schema_ is None:
                raise BadRequest("response_format json_schema needs json_schema.schema")
            return {"json_schema": self.json_schema.schema_}
        if self.type == "structural_tag":
            return {"structural_tag": {"type": "structural_tag", **tag}}
        return {}


def _check_fixed(req: msgspec.Struct, fixed: dict[str, bool]) -> None:
    """SGLang's server switches that the SGLang router writes into every request it forwards
    are accepted at the value braid implements, and refused at another."""
    for name, value in fixed.items():
        if getattr(req, name) != value:
            raise ValueError(f"{name} must be {str(value).lower()} on braid")


class _OpenAIRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # The served model's name (`--served-model-name`); another is a 404 unless the server
    # runs with --accept-any-model. Absent: the served model.
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted, unused
    cache_salt: CacheSalt | None = None
    # SGLang's switches, which its router fills in (see _check_fixed).
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    return_hidden_states: bool = False

    def __post_init__(self) -> None:
        fixed = {"no_stop_trim": False, "skip_special_tokens": True, "return_hidden_states": False}
        _check_fixed(self, fixed)


class CompletionRequest(_OpenAIRequest):
    prompt: str | list[Any]  # text, token ids, or a list of either
    echo: bool = False  # prepend the prompt (and, with logprobs, its tokens' logprobs)
    logprobs: int | None = None  # report this many top logprobs per token (0: just its own)
    # Sample this many per prompt and return the n with the highest mean token logprob.
    best_of: int | None = None


class ContentPart(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
    index: int | None = None  # what a client that rebuilt the call from stream deltas keeps


class ChatMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # "function": the legacy API's function result (read as a tool message)
    role: Literal["system", "user", "assistant", "developer", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    # What the openai client sends back when an agent appends a reply message as it came.
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: FunctionCall | None = None  # the legacy API's single call
    # An assistant's thought (vLLM's and SGLang's name, and the newer alias), which the chat
    # template renders or drops as its model was trained.
    reasoning_content: str | None = None
    reasoning: str | None = None

    def __post_init__(self) -> None:
        if self.reasoning_content is not None or self.reasoning is not None:
            if self.role != "assistant":
                raise ValueError("only assistant messages carry reasoning_content")
            if None not in (self.reasoning_content, self.reasoning) and (
                self.reasoning_content != self.reasoning
            ):
                raise ValueError("reasoning_content and reasoning differ: give one")

    @property
    def text(self) -> str:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return content or ""

    @property
    def thought(self) -> str | None:
        return self.reasoning_content if self.reasoning_content is not None else self.reasoning

    def as_dict(self) -> dict[str, Any]:
        """The message as chat templates take it: a thought under both names templates read
        (Qwen3's reasoning_content, GPT-OSS's thinking)."""
        role = "system" if self.role == "developer" else self.role
        message = {"role": role, "content": self.text}
        if self.thought is not None:
            message |= {"reasoning_content": self.thought, "thinking": self.thought}
        return message


class FunctionDefinition(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; absent: no parameters
    strict: bool | None = None  # accepted: arguments always follow the schema here


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None  # the newer name of max_tokens
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: OpenAI's default, true
    # The legacy function-calling API, read as tools (one call at most); the reply then
    # carries `function_call` instead of tool_calls (legacy_functions).
    functions: list[FunctionDefinition] | None = None
    function_call: Literal["none", "auto"] | FunctionName | None = None
    # Variables for the model's chat template (Qwen3's enable_thinking...), as vLLM and
    # SGLang take them; never apply_chat_template's own arguments (openai_routes checks).
    chat_template_kwargs: dict[str, Any] | None = None
    # Sent by OpenAI clients and agent frameworks; accepted and unused here.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # SGLang's, filled in by its router.
    continue_final_message: bool = False
    # The model's thought (chat/reasoning_fields.py reads them): budgets under each server's
    # name, OpenAI's effort, and how the thought comes back.
    reasoning_effort: str | None = None
    thinking_token_budget: Budget | None = None  # vLLM's
    thinking_budget: Budget | None = None  # braid's SamplingParams name
    max_thinking_tokens: Budget | None = None
    custom_params: dict[str, Any] | None = None  # SGLang's: {"thinking_budget": N}
    thinking_budget_mode: Literal["soft", "hard"] | None = None
    reasoning: bool | None = None  # braid's: false runs as if the model had no thoughts
    separate_reasoning: bool = True  # SGLang's: false leaves the thought in the content
    stream_reasoning: bool = True  # SGLang's: false streams the thought in one piece
    include_reasoning: bool = True  # false drops the thought from the reply

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_fixed(self, {"continue_final_message": False})
        if self.functions is not None:
            self._read_legacy_functions()

    @property
    def legacy_functions(self) -> bool:
        return self.functions is not None

    def _read_legacy_functions(self) -> None:
        """functions / function_call as tools / tool_choice (one call at most), and the
        conversation's function_call messages and function results as calls and tool
        messages."""
        if self.tools is not None or self.tool_choice is not None:
            raise ValueError("give tools or the legacy functions, not both")
        self.tools = [Tool("function", f) for f in self.functions]
        choice = self.function_call
        if isinstance(choice, FunctionName):
            choice = NamedToolChoice("function", choice)
        self.tool_choice, self.parallel_tool_calls = choice, False
        last_call: dict[str, str] = {}  # function name -> the id given to its latest call
        for i, m in enumerate(self.messages):
            if m.function_call is not None:
                if m.role != "assistant":
                    raise ValueError(f"messages[{i}]: only assistant messages carry function_call")
                call_id = f"call_{i}"
                m.tool_calls = [ToolCall(id=call_id, function=m.function_call)]
                m.function_call = None
                last_call[m.tool_calls[0].function.name] = call_id
            elif m.role == "function":
                if m.name not in last_call:
                    raise ValueError(f"messages[{i}]: a function result with no call of {m.name!r}")
                m.role, m.tool_call_id = "tool", last_call[m.name]


# The response header naming the request's fields braid ignored.
IGNORED_HEADER = "X-Braid-Ignored-Fields"
# Other servers' names for braid's constraints: vLLM's older guided_* fields and SGLang's
# `ebnf` (a grammar in any dialect braid reads: grammars/dialects).
_OTHER_CONSTRAINTS = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choices",
    "guided_grammar": "grammar",
    "ebnf": "grammar",
}
# vLLM's structured_outputs: its constraints, and its switches braid takes at the value it
# implements (None: any value, it changes nothing in the reply).
_STRUCTURED_OUTPUTS = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choices",
    "grammar": "grammar",
    "structural_tag": "structural_tag",  # a dict or its JSON text, as vLLM sends it
}
_STRUCTURED_SWITCHES: dict[str, Any] = {
    "disable_fallback": None,  # braid has one grammar engine: nothing to fall back from
    "disable_additional_properties": None,  # braid's default: unlisted properties not written
}
# Fields other servers take that would change the output, which braid does not implement:
# a 400 naming them unless they hold the value that changes nothing (ignoring them would be
# a silently wrong reply). The value None: any non-null value is refused.
_UNIMPLEMENTED: dict[str, Any] = {
    "suffix": None,  # completions' fill-in-the-middle
    "audio": None,
    "modalities": ["text"],
    "prediction": None,
    "web_search_options": None,
    "guided_whitespace_pattern": None,
    "truncate_prompt_tokens": None,
    "chat_template": None,
    "documents": None,
    "echo": False,  # on chat (completions has its own)
    "add_generation_prompt": True,
    "use_beam_search": False,
    "include_stop_str_in_output": False,
    "typical_p": 1.0,
    "mirostat": 0,
}


COMPLETION_MAX_TOKENS = 16  # /v1/completions' max_tokens when a request gives none


def openai_request(
    obj: dict[str, Any], kind: type[_OpenAIRequest], context_length: int
) -> tuple[Any, SamplingParams, list[str]]:
    """Decode an OpenAI request body into its Struct, its SamplingParams and the names of
    the fields it sent that braid ignores (unknown to it, and not output-changing ones it
    knows it lacks: those are a 400)."""
    obj, ignored = _known_fields(obj, kind)
    chat = issubclass(kind, ChatCompletionRequest)
    fields, rest = split_sampling(obj, REASONING_FIELDS if chat else frozenset())
    req = convert(rest, kind)
    if fields.get("token_healing"):
        check_healing(req)
    if isinstance(req, ChatCompletionRequest):
        if not req.messages:
            raise BadRequest("messages must not be empty")
        if req.max_completion_tokens is not None:
            fields["max_tokens"] = req.max_completion_tokens
        if req.response_format is not None:
            fields.update(req.response_format.as_sampling())
        fields["logprobs"] = req.logprobs
        fields["top_logprobs"] = req.top_logprobs or 0
    elif req.logprobs is not None:
        if req.logprobs < 0:
            raise BadRequest("logprobs must be >= 0")
        fields["logprobs"], fields["top_logprobs"] = True, req.logprobs
        if req.echo:
            fields["prompt_logprobs_from"] = 1
    # OpenAI's defaults: a chat reply runs to the rest of the context (the engine caps it
    # there), a text completion to 16 tokens (as OpenAI's legacy API and vLLM).
    fields.setdefault("max_tokens", context_length if chat else COMPLETION_MAX_TOKENS)
    return req, sampling_params(fields), ignored


def check_healing(req: Any) -> None:
    """token_healing=true is honoured on a text completion without echo or logprobs; a 400
    naming it elsewhere."""
    if not isinstance(req, CompletionRequest):
        raise BadRequest(
            "token_healing: a conversation's prompt ends in the chat template's generation "
            "prompt, which is not healed; heal a text prompt on /v1/completions or /generate"
        )
    if req.echo or req.logprobs is not None:
        raise BadRequest(
            "token_healing cannot be combined with echo or logprobs: the first output token "
            "spells the prompt's last token again, so the listing would not match the text"
        )


def _known_fields(obj: dict[str, Any], kind: type[_OpenAIRequest]) -> tuple[dict, list[str]]:
    """The body with vLLM's constraint fields under braid's names and the fields braid does
    not know taken out (returned by name); an output-changing field braid lacks is a 400."""
    known = {f.encode_name for f in msgspec.structs.fields(kind)}
    known |= SAMPLING_FIELDS | REPORTING_FIELDS
    obj = dict(obj)
    constraints = [
        (k, _OTHER_CONSTRAINTS[k], obj.pop(k)) for k in list(obj) if k in _OTHER_CONSTRAINTS
    ]
    constraints += _structured_outputs(obj.pop("structured_outputs", None))
    for theirs, ours, value in constraints:
        if value is None:
            continue
        value = json.loads(value) if ours == "json_schema" and isinstance(value, str) else value
        # guidance's VLLMModel sends one grammar under both of vLLM's names: the same one twice
        # is one constraint.
        if obj.get(ours) is not None and obj[ours] != value:
            raise BadRequest(f"{theirs} and {ours} give the same constraint twice: give one")
        obj[ours] = value
    ignored = []
    for key in [k for k in obj if k not in known]:
        value = obj.pop(key)
        if key in _UNIMPLEMENTED:
            harmless = _UNIMPLEMENTED[key]
            if value is not None and value != harmless:
                raise BadRequest(f"{key} is not implemented by braid (it would change the reply)")
        elif value is not None:
            ignored.append(key)
    return obj, ignored


def _structured_outputs(structured: Any) -> list[tuple[str, str, Any]]:
    """vLLM's structured_outputs as (its name, braid's field, the value)."""
    if structured is None:
        return []
    if not isinstance(structured, dict):
        raise BadRequest("structured_outputs must be an object")
    found = []
    for key, value in structured.items():
        where = f"structured_outputs.{key}"
        if key in _STRUCTURED_OUTPUTS:
            found.append((where, _STRUCTURED_OUTPUTS[key], value))
        elif key == "json_object":
            if value:
                found.append((where, "json_schema", {"type": "object"}))
        elif key == "disable_any_whitespace":  # JSON without whitespace (docs/json-schema.md)
            if value:
                found.append((where, "json_compact", True))
        elif key == "whitespace_pattern":
            if value is not None:
                raise BadRequest(
                    f"{where} is not supported (braid writes JSON with bounded whitespace, or "
                    "none with disable_any_whitespace)"
                )
        elif key not in _STRUCTURED_SWITCHES:
            raise BadRequest(
                f"{where} is not supported (json, regex, choice, grammar, structural_tag and "
                "json_object are)"
            )
    return found


# ---- SGLang's native /generate ------------------------------------------------------------

# SGLang's names for our fields, and its switches we accept only at the value we implement.
_SGLANG_NAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "ebnf": "grammar",
    "sampling_seed": "seed",
}
_SGLANG_FIXED = {
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
}


class LoraAdapterRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /load_lora_adapter (both fields) and /unload_lora_adapter (the name), as SGLang."""

    lora_name: str
    lora_path: str | None = None


class GenerateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    text: str | list[str] | None = None
    input_ids: list[Any] | None = None  # token ids, or a list of them
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None  # one, or one per item
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: the prompt's last token only
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None
    cache_salt: CacheSalt | None = None
    # SGLang's name: the loaded LoRA adapter every prompt of the request runs under.
    lora_path: str | None = None
    program_id: ProgramId | None = None  # braid's: see ProgramId
    # What the SGLang router writes into every request it forwards (see _check_fixed).
    model: str | None = None  # accepted, unused: the served model
    log_metrics: bool = True
    no_logs: bool = False
    background: bool = False
    return_hidden_states: bool = False
    return_bytes: bool = False
    return_entropy: bool = False

    def __post_init__(self) -> None:
        _check_fixed(
            self,
            {
                "background": False,
                "return_hidden_states": False,
                "return_bytes": False,
                "return_entropy": False,
            },
        )

    def prompts(self) -> tuple[list[str | list[int]], bool]:
        """(the prompts, whether the request was a batch)."""
        if (self.text is None) == (self.input_ids is None):
            raise BadRequest("give exactly one of text and input_ids")
        if self.text is not None:
            return ([self.text], False) if isinstance(self.text, str) else (self.text, True)
        ids = self.input_ids
        if ids and all(isinstance(x, list) for x in ids):
            return ids, True
        return [ids], False

    def rids(self, num_prompts: int) -> list[str]:
        """One request id per prompt: given, or made up."""
        if self.rid is None:
            return [uuid.uuid4().hex for _ in range(num_prompts)]
        rids = [self.rid] if isinstance(self.rid, str) else self.rid
        if len(rids) != num_prompts:
            raise BadRequest(f"rid: give one per prompt ({num_prompts}), got {len(rids)}")
        return rids

    def params(self, i: int, num_prompt_tokens: int) -> SamplingParams:
        """The SamplingParams of batch item i, whose prompt has this many tokens."""
        raw = self.sampling_params
        if isinstance(raw, list):
            if i >= len(raw):
                raise BadRequest("give one sampling_params per prompt, or a single one")
            raw = raw[i]
        fields = dict(raw or {})
        for key, value in _SGLANG_FIXED.items():
            if fields.pop(key, value) != value:
                raise BadRequest(f"sampling_params.{key} must be {value} on braid")
        if fields.get("top_k") == -1:  # SGLang's "off"
            fields["top_k"] = 0
        if not fields.get("stop_regex", True):  # SGLang's frontend always sends it, empty
            del fields["stop_regex"]
        for theirs, ours in _SGLANG_NAMES.items():
            if theirs in fields:
                if ours in fields:
                    raise BadRequest(f"give one of sampling_params.{theirs} and .{ours}")
                fields[ours] = fields.pop(theirs)
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.return_logprob:
            fields["logprobs"] = True
            fields["top_logprobs"] = self.top_logprobs_num
            if fields.get("token_healing") and self.logprob_start_len != -1:
                raise BadRequest(
                    "token_healing cannot be combined with logprob_start_len: the prompt "
                    "logprobs asked for are of the prompt as given, which healing changes"
                )
            start = self.prompt_logprobs_start(num_prompt_tokens)
            if start < num_prompt_tokens:  # the first token has no logprob: start at 1
                fields["prompt_logprobs_from"] = max(1, start)
        return sampling_params(fields)

    def prompt_logprobs_start(self, num_prompt_tokens: int) -> int:
        """The first prompt position whose logprob is reported."""
        if self.logprob_start_len == -1:
            return max(0, num_prompt_tokens - 1)
        if self.logprob_start_len < 0:
            raise BadRequest("logprob_start_len must be >= 0, or -1")
        return self.logprob_start_len


class ReleaseRequest(msgspec.Struct, forbid_unknown_fields=True):
    """braid's own: a program state will not continue (RemoteBackend at its end)."""

    program_id: ProgramId
    cache_salt: CacheSalt | None = None
    lora_path: str | None = None


class PrepareRequest(msgspec.Struct, forbid_unknown_fields=True):
    """braid's own: compile a gen's constraint now, before its request comes (RemoteBackend
    when the gen is submitted); /generate's sampling_params."""

    sampling_params: dict[str, Any]


class ScoreRequest(msgspec.Struct, forbid_unknown_fields=True):
    """braid's own: what `select` asks a remote engine (see runtime.scoring)."""

    prefix: str
    continuations: list[str]
    cache_salt: CacheSalt | None = None
    lora_path: str | None = None  # the loaded LoRA adapter to score under, as /generate's
