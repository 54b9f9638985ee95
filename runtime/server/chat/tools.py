"""Function calling on the conversational routes (chat completions, Responses, Messages): tools
and tool turns rendered into the prompt, the constraint a tool_choice puts on the output, and
the calls read back out of it.

Calls are written in the Hermes format, which Qwen2.5, Qwen3, Hermes and other models are
trained on and their chat templates render:

    <tool_call>
    {"name": "get_weather", "arguments": {"city":"Paris"}}
    </tool_call>

several calls one after another, a newline between them. A chat template that renders tools
in this format (it has a tools section and writes `<tool_call>`) renders the tools, the
assistant messages' calls and the tool messages itself; for any other template (the default
model's among them) `conversation` writes them as plain messages: a system preamble that lists
the tools and the format, each call in its assistant message's text, tool results as user
messages of <tool_response> blocks.

The output is constrained by a grammars.ToolCalls, which the engine compiles like any other
constraint; grammars/tool_calls.py defines the format above and the regex: each call names one
of the tools, with arguments valid under that tool's parameters schema once complete. In auto
mode text may stand instead: any text that does not start with `<tool_call>` (or the
response_format's JSON); whether the model calls is decided by its first tokens, and once it
has written `<tool_call>` it can only finish a call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from braid.grammars.constraints import AnyText, ToolCalls, ToolSchema
from braid.grammars.tool_calls import CLOSE, MARK, MID, OPEN, REPLY, SEPARATOR
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.chat.conversation import Conversation
from braid.runtime.server.wire import BadRequest, ChatMessage, NamedToolChoice, Tool
from braid.runtime.text import template_render
from braid.runtime.text.template_render import TemplateLimitError

# OpenAI's rule for function names (letters, digits, _ and -), and dots (namespaced tools):
# none needs escaping in JSON or a regex.
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


# ---- what the request asks for ---------------------------------------------------------------


@dataclass(frozen=True)
class ToolPlan:
    """A request's tools and what its tool_choice lets the output be."""

    tools: list[Tool]  # every tool, as rendered into the prompt
    mode: str  # "none" (text), "auto" (text or calls), "required" or "named" (calls)
    callable: list[Tool]  # the tools a call may name
    parallel: bool  # one call or more (else exactly one); named: one

    @property
    def calls(self) -> bool:
        """Whether the output may be calls (and is then constrained and parsed)."""
        return self.mode != "none"


def plan(req: Conversation) -> ToolPlan | None:
    """The request's tools checked against tool_choice; None without tools."""
    tools, choice = req.tools or [], req.tool_choice
    names: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if not _NAME.fullmatch(name):
            raise BadRequest(
                f"tools[{i}].function.name must be 1 to 64 letters, digits, '_', '-' or '.'; "
                f"got {name!r}"
            )
        if name in names:
            raise BadRequest(f"tools[{i}].function.name: {name!r} is given twice")
        names.add(name)
        parameters_schema(tool, i)  # checked now, before anything runs
    if not tools:
        if choice not in (None, "none", "auto"):
            raise BadRequest("tool_choice 'required' or a named function needs tools")
        return None
    parallel = req.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        named = [t for t in tools if t.function.name == choice.function.name]
        if not named:
            raise BadRequest(f"tool_choice names {choice.function.name!r}, which is not in tools")
        return ToolPlan(tools, "named", named, False)  # exactly the one call asked for
    return ToolPlan(tools, choice or "auto", tools, parallel)


def parameters_schema(tool: Tool, i: int) -> dict[str, Any]:
    """The JSON schema a tool's arguments follow: an object schema (absent: no arguments)."""
    schema = tool.function.parameters
    if schema is None:
        return _NO_PARAMETERS
    kind = schema.get("type", "object")
    if kind != "object":
        raise BadRequest(
            f"tools[{i}].function.parameters must be a schema of type 'object'; got {kind!r}"
        )
    return {"type": "object", **schema}


def uses_tools(req: Conversation) -> bool:
    """Whether the conversation needs tool-aware rendering: tools, calls or tool results."""
    return bool(req.tools) or any(
        m.role == "tool" or m.tool_calls or m.function_call is not None for m in req.messages
    )


# ---- the prompt ------------------------------------------------------------------------------


def template_renders_tools(tokenizer) -> bool:
    """Whether the model's chat template renders tools, calls and tool results itself in the
    format the output is constrained to (a template with a tools section writing <tool_call>:
    Qwen2.5's, Qwen3's, Hermes'...)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: apply_chat_template picks tool_use
        template = template.get("tool_use") or template.get("default")
    if not isinstance(template, str) or MARK not in template:
        return False
    probe = {"type": "function", "function": {"name": "braid_probe_tool", "parameters": {}}}
    function = {"name": "braid_probe_call", "arguments": {}}
    call = {"id": "call_0", "type": "function", "function": function}
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "braid_probe_result"},
    ]
    try:
        text = template_render.render(tokenizer, messages, tools=[probe])
    except TemplateLimitError:  # a template that runs without end: refused at start-up
        raise
    except Exception:
        return False
    return all(
        s in text for s in ("braid_probe_tool", MARK, "braid_probe_call", "braid_probe_result")
    )


def rendered_chars(req: Conversation) -> int:
    """Characters of the request that any rendering of it writes into the prompt: each
    message's text, its calls' names and arguments, each tool's name, description and
    parameters (as compact JSON). Counted before anything is rendered, so that a conversation
    no tokenization could fit is refused before the template and the tokenizer pay for it
    (the template's own text is counted once rendered: Service.render_chat)."""
    chars = 0
    for m in req.messages:
        chars += len(m.text)
        for call in m.tool_calls or ():
            chars += len(call.function.name) + len(call.function.arguments)
    for tool in req.tools or ():
        function = tool.function
        chars += len(function.name) + len(function.description or "")
        if function.parameters is not None:
            chars += len(msgspec.json.encode(function.parameters).decode())
    return chars


def tool_json(tool: Tool) -> dict[str, Any]:
    """A tool as OpenAI's JSON (what chat templates and our preamble show the model)."""
    function = {"name": tool.function.name}
    if tool.function.description is not None:
        function["description"] = tool.function.description
    function["parameters"] = tool.function.parameters or _NO_PARAMETERS
    return {"type": "function", "function": function}


PREAMBLE = """# Tools

You may call one or more functions to help with the user's request. Their signatures are \
within <tools></tools> XML tags:
<tools>
{tools}
</tools>

To call functions, reply with the calls only, each a JSON object with the function's name and \
arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>
Their results come back within <tool_response></tool_response> XML tags. Otherwise reply in \
plain text."""


def conversation(
    req: Conversation, native: bool, system_role: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(the messages, the tools) to hand the chat template. `native`: the template renders
    tools, calls and tool messages itself; otherwise they become plain system, user and
    assistant messages here. `system_role`: the template renders system messages (else the
    tool preamble opens the first user message)."""
    tools = [tool_json(t) for t in req.tools or []]
    names = {}  # call id -> function name, for tool messages
    for i, m in enumerate(req.messages):
        if m.function_call is not None or m.role == "function":
            raise BadRequest(
                f"messages[{i}]: function_call messages and function results (the legacy "
                "API) go with `functions`; with tools use tool_calls and tool messages"
            )
        if m.tool_calls and m.role != "assistant":
            raise BadRequest(f"messages[{i}]: only assistant messages carry tool_calls")
        for call in m.tool_calls or ():
            names[call.id] = call.function.name
    if native:
        return [_native(m, names) for m in req.messages], tools or None
    messages: list[dict[str, Any]] = []
    for m in req.messages:
        if m.role == "tool":
            block = f"<tool_response>\n{m.text}\n</tool_response>"
            if messages and messages[-1].get("tool_results"):  # one user message per turn
                messages[-1]["content"] += "\n" + block
            else:
                messages.append({"role": "user", "content": block, "tool_results": True})
            continue
        message = m.as_dict()
        if m.tool_calls:
            calls = "\n".join(
                call_text(c.function.name, c.function.arguments) for c in m.tool_calls
            )
            message["content"] = f"{message['content']}\n{calls}" if message["content"] else calls
        messages.append(message)
    for m in messages:
        m.pop("tool_results", None)
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        preamble = PREAMBLE.format(tools=listing)
        if messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{preamble}".lstrip()
        elif system_role:
            messages.insert(0, {"role": "system", "content": preamble})
        else:
            first = next((m for m in messages if m["role"] == "user"), None)
            if first is None:
                messages.insert(0, first := {"role": "user", "content": ""})
            first["content"] = f"{preamble}\n\n{first['content']}".rstrip()
    return messages, None


def call_text(name: str, arguments: str) -> str:
    """One call as the model writes it (arguments: JSON text)."""
    return f"{OPEN}{name}{MID}{arguments}{CLOSE}"


def _native(m: ChatMessage, names: dict[str, str]) -> dict[str, Any]:
    """A message as chat templates with tool support take it (arguments as objects)."""
    message = m.as_dict()
    if m.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _loads(c.function.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.role == "tool":
        message["tool_call_id"] = m.tool_call_id
        if m.tool_call_id in names:
            message["name"] = names[m.tool_call_id]
    return message


def _loads(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


# ---- the constraint --------------------------------------------------------------------------


def constrain(plan: ToolPlan, params: SamplingParams) -> SamplingParams:
    """params constrained to what plan.mode allows: calls of plan.callable (one, or several
    with plan.parallel), or in auto mode text instead (the request's own json_schema or
    choices constraint, which response_format sets, applies to that text). The constraint is
    a grammars.ToolCalls, which the engine compiles like any other; its errors name where
    they come from: tools[i].function.parameters, or the reply's constraint."""
    index = {id(t): i for i, t in enumerate(plan.tools)}
    tools = []
    for tool in plan.callable:
        i = index[id(tool)]
        where = f"tools[{i}].function.parameters"
        schema = parameters_schema(tool, i)
        try:
            tools.append(ToolSchema.of(tool.function.name, schema, where))
        except ValueError as e:
            raise BadRequest(str(e)) from None
    text = None
    if plan.mode == "auto":
        if any(v is not None for v in (params.regex, params.grammar, params.structural_tag)):
            raise BadRequest(
                "regex, grammar and structural tags cannot be combined with tools in "
                "tool_choice 'auto' (response_format json_schema and choices can)"
            )
        try:
            own = params.constraint  # response_format's json_schema or choices, or None
        except ValueError as e:
            raise BadRequest(f"{REPLY}: {e}") from None
        text = AnyText() if own is None else own
        if params.choices is not None and any(c.startswith(MARK) for c in params.choices):
            raise BadRequest(f"with tools, choices must not start with {MARK}")
    fields = {
        "tool_calls": ToolCalls(tuple(tools), plan.parallel, text),
        "regex": None,
        "json_schema": None,
        "choices": None,
        "grammar": None,
        "structural_tag": None,
    }
    if plan.mode != "auto":  # the output is calls: a stop string could only cut one short
        fields |= {"stop": None, "stop_regex": None}
    return msgspec.structs.replace(params, **fields)


# ---- reading calls back ----------------------------------------------------------------------


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""

    def as_json(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass
class CallParser:
    """Reads an output constrained by `constrain` as it streams. `feed` takes text and gives
    what it completes: ("text", str) for text, and for each call once it is whole ("call",
    i) then ("arguments", i, its arguments), the call then being `calls[i]`.

    A text that starts with MARK is calls; one that cannot start it is text; a proper prefix
    of MARK waits (and is text if the output ends there). Only whole calls are reported: one
    cut off by max_tokens never is. A call that repeats an earlier one (same name, same
    arguments) ends the output: a model that has made its calls and writes them again would
    otherwise go on until max_tokens (`repeated` says so; what follows is dropped).
    """

    calls: list[Call] = field(default_factory=list)
    repeated: bool = False
    _current: Call | None = None  # the call being read
    _state: str = "start"
    _buffer: str = ""
    _expect: str = ""  # the fixed text due next, in state "fixed"
    _then: str = ""  # the state after it
    _depth: int = 0  # in the arguments: open braces and brackets
    _in_string: bool = False
    _escaped: bool = False

    @property
    def is_text(self) -> bool:
        """The output is text, not calls (so far)."""
        return self._state in ("start", "text")

    @property
    def complete(self) -> bool:
        """Every call so far is whole (the output stopped between calls, or at a repeat)."""
        return self._state in ("between", "ended") and bool(self.calls)

    def feed(self, text: str) -> list[tuple]:
        self._buffer += text
        events: list[tuple] = []
        while self._buffer:
            state = self._state
            if state == "start":
                if self._buffer.startswith(MARK):
                    self._fixed(OPEN, "name")
                elif MARK.startswith(self._buffer):
                    break  # maybe a call: wait
                else:
                    self._state = "text"
            elif state == "text":
                events.append(("text", self._buffer))
                self._buffer = ""
            elif state == "fixed":
                n = min(len(self._buffer), len(self._expect))
                if self._buffer[:n] != self._expect[:n]:  # not what the constraint allows
                    self._state, self._buffer = "broken", ""
                    break
                self._buffer, self._expect = self._buffer[n:], self._expect[n:]
                if not self._expect:
                    self._state = self._then
            elif state == "name":
                end = self._buffer.find('"')
                if end < 0:
                    break
                self._current = Call(f"call_{uuid.uuid4().hex[:24]}", self._buffer[:end])
                self._buffer = self._buffer[end:]
                self._fixed(MID, "arguments")
                self._depth, self._in_string, self._escaped = 0, False, False
            elif state == "arguments":
                end = self._scan()
                self._current.arguments += self._buffer[:end]
                self._buffer = self._buffer[end:]
                if self._depth == 0:  # the object closed
                    self._fixed(CLOSE, "called")
            elif state == "called":
                events += self._whole(self._current)
            elif state == "between":
                self._buffer = self._buffer.lstrip(SEPARATOR)
                if self._buffer:
                    self._fixed(OPEN, "name")
            else:  # ended at a repeat, or broken: the rest is dropped
                self._buffer = ""
        if self._state == "called":  # the close was the last text fed
            events += self._whole(self._current)
        return events

    def _whole(self, call: Call) -> list[tuple]:
        """A call read to its close: reported, or the end of the output if it repeats one."""
        self._current = None
        if any(c.name == call.name and _same_arguments(c, call) for c in self.calls):
            self.repeated, self._state, self._buffer = True, "ended", ""
            return []
        self._state = "between"
        self.calls.append(call)
        i = len(self.calls) - 1
        return [("call", i), ("arguments", i, call.arguments)]

    def finish(self) -> list[tuple]:
        """At the end of the output: a held prefix of MARK is text after all."""
        if self._state == "start" and self._buffer:
            self._state = "text"
            return self.feed("")
        return []

    def _fixed(self, text: str, then: str) -> None:
        self._state, self._expect, self._then = "fixed", text, then

    def _scan(self) -> int:
        """How much of the buffer belongs to the arguments (all of it until they close)."""
        for i, c in enumerate(self._buffer):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return len(self._buffer)


def parse(text: str) -> CallParser:
    """A whole output read at once (what streaming reads piece by piece)."""
    parser = CallParser()
    parser.feed(text)
    parser.finish()
    return parser


def finish_reason(parser: CallParser, engine_reason: str | None) -> str | None:
    """OpenAI's "tool_calls" when the output ended (not cut off) after whole calls; a
    repeat ends it (the conversation pipeline aborts the request there)."""
    if parser.complete and (engine_reason == "stop" or parser.repeated):
        return "tool_calls"
    return engine_reason


def _same_arguments(a: Call, b: Call) -> bool:
    """Whether two calls' arguments are the same JSON value: the model may write one call
    again with other whitespace or another member order."""
    try:
        return json.loads(a.arguments) == json.loads(b.arguments)
    except ValueError:  # not JSON (a grammar-free call cut short): their text, then
        return a.arguments == b.arguments
