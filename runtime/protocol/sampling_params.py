"""SamplingParams: defined once, used by `gen`, the engine, the server and the sampler."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgspec
from msgspec.structs import force_setattr

from braid.grammars import dialects
from braid.grammars.constraints import (
    COMPACT,
    JSON_WHITESPACE,
    Choices,
    Constraint,
    Ebnf,
    JsonSchema,
    Regex,
    StructuralTag,
    ToolCalls,
)
from braid.runtime.protocol.stop_regex import check_stop_regex

_CONSTRAINTS = ("regex", "json_schema", "choices", "grammar", "structural_tag", "tool_calls")
_INT64 = 2**63


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one request samples, what it reports, and when it stops.

    A msgspec Struct so the server decodes wire JSON straight into it and the same
    validation runs everywhere.
    """

    max_tokens: int = 128
    min_tokens: int = 0  # EOS and stop token ids are suppressed before this many tokens
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # 1 means off
    top_k: int = 0  # 0 means off
    min_p: float = 0.0  # 0 means off
    frequency_penalty: float = 0.0  # subtracted per earlier occurrence in the output
    presence_penalty: float = 0.0  # subtracted once if the token occurred in the output
    repetition_penalty: float = 1.0  # >1 discourages tokens of the prompt and output
    # token id -> a bias in [-100, 100] added to its logit before sampling (after the
    # penalties, before a constraint's mask): -100 all but bans a token, 100 all but forces
    # it. On the wire (OpenAI's logit_bias) the ids are strings.
    logit_bias: dict[int, float] | None = None
    stop: str | list[str] | None = None
    # Stop where the output matches any of these (Python syntax without anchors, lookarounds
    # or backreferences; \d, \w and \s are ASCII); the output ends before the match.
    stop_regex: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None  # None: a fresh seed per request
    n: int = 1  # independent samples of the same prompt (its prefix is computed once)
    logprobs: bool = False  # report the logprob of each generated token
    top_logprobs: int = 0  # and of this many most likely alternatives at each step
    # Report logprobs of the prompt's tokens from this position on (select scores choices
    # this way, with max_tokens=0). None: no prompt logprobs.
    prompt_logprobs_from: int | None = None
    # Record per output token whether the grammar forced it and how many tokens its mask
    # allowed, and the request's stage times, in meta["trace"] (the trace view's facts).
    trace: bool = False
    # Constraints (at most one), as in SGLang's sampling params: the output must match the
    # regex, be a JSON document valid under the schema (a dict or its JSON text), be one of
    # the choices, or be a sentence of the grammar: lark, llguidance's lark or GBNF
    # (grammars/dialects).
    regex: str | None = None
    json_schema: dict[str, Any] | str | None = None
    # The JSON document without whitespace (vLLM's disable_any_whitespace); by default it may
    # hold the whitespace models write, bounded (grammars/constraints.py JSON_WHITESPACE).
    json_compact: bool = False
    choices: list[str] | None = None
    grammar: str | None = None
    # Or be in the language of an XGrammar structural tag (grammars/structural_tag.py): the
    # `{"type": "structural_tag", "format": ...}` object or the legacy structures + triggers,
    # a dict or its JSON text (SGLang's /generate sends text).
    structural_tag: dict[str, Any] | str | None = None
    # A constrained output that max_tokens would cut is steered to complete its document in
    # time (the tokens that would leave too little room to finish are masked near the end);
    # finish_reason stays "length" when that changed the output. False: cut where it stops.
    close_documents: bool = True
    # Or be calls of a chat request's tools (a grammars.ToolCalls), which the server sets from
    # its tools and tool_choice (runtime/server/chat/tools.py). Never read from a request body:
    # it is typed loosely because msgspec cannot decode a ToolCalls (its `text` is a union of
    # dataclasses), and __post_init__ refuses anything else.
    tool_calls: Any = None
    # The output may think before it answers, in the engine's reasoning format: the constraint
    # then holds the answer after the thought (grammars/phases.py), and a budget bounds the
    # thought: at thinking_budget thought tokens its end is forced ("hard"); "soft" also
    # closes it earlier, from 80% of the budget, at the first step where the end marker is
    # among the model's 5 likeliest tokens. thinking_budget 0: no thought.
    reasoning: bool = False
    thinking_budget: int | None = None
    thinking_budget_mode: str = "soft"
    # Token healing (grammars/token_healing.py): a text prompt's last token is taken off and
    # the output's first tokens spell it again, then go on as the model likes (under the
    # constraint, if any); the output text starts after it. Off here, as in vLLM and SGLang;
    # a program's gens heal by default (as guidance's).
    token_healing: bool = False

    def __post_init__(self) -> None:
        # Ints a kernel or the sampler reads as int64 are bounded by it; floats must be finite
        # (JSON cannot carry NaN or infinity, Python callers can).
        checks = [
            (self.max_tokens >= 0, "max_tokens must be >= 0"),
            (0 <= self.min_tokens, "min_tokens must be >= 0"),
            (
                self.min_tokens <= self.max_tokens,
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})",
            ),
            (0 <= self.temperature < math.inf, "temperature must be >= 0 and finite"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.top_k < _INT64, "top_k must be >= 0 and < 2**63 (0 turns it off)"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (0 < self.repetition_penalty < math.inf, "repetition_penalty must be > 0 and finite"),
            (
                self.seed is None or -_INT64 <= self.seed < _INT64,
                "seed must be in [-2**63, 2**63)",
            ),
            (self.n >= 1, "n must be >= 1"),
            (
                self.thinking_budget is None or 0 <= self.thinking_budget < _INT64,
                "thinking_budget must be >= 0",
            ),
            (
                self.thinking_budget_mode in ("soft", "hard"),
                "thinking_budget_mode must be 'soft' or 'hard'",
            ),
            (
                self.thinking_budget is None or self.reasoning,
                "thinking_budget needs reasoning=True (a budget bounds a thought)",
            ),
            (0 <= self.top_logprobs <= 20, "top_logprobs must be in [0, 20]"),
            (
                self.prompt_logprobs_from is None or self.prompt_logprobs_from >= 1,
                "prompt_logprobs_from must be >= 1 (the first token has no logprob)",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"SamplingParams: {message}")
        bad_bias = {
            t: b
            for t, b in (self.logit_bias or {}).items()
            if not -100 <= b <= 100  # NaN too
        }
        if bad_bias:
            raise ValueError(
                f"SamplingParams: logit_bias values must be in [-100, 100]; got {bad_bias}"
            )
        if self.grammar is not None:
            self._take_reply_attributes()
        if any(s == "" for s in self.stop_strings):
            raise ValueError("SamplingParams: stop strings must not be empty")
        for pattern in self.stop_regexes:
            check_stop_regex(pattern)
        given = [k for k in _CONSTRAINTS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"SamplingParams: give at most one constraint, got {given}")
        if self.json_compact and given and given[0] not in ("json_schema", "tool_calls"):
            raise ValueError(
                f"SamplingParams: json_compact applies to json_schema and tool calls, not to "
                f"{given[0]}"
            )
        if self.choices is not None and not self.choices:
            raise ValueError("SamplingParams: choices must not be empty")
        if self.tool_calls is not None and not isinstance(self.tool_calls, ToolCalls):
            raise ValueError(
                "SamplingParams: tool_calls must be a grammars.ToolCalls; it is not a request "
                "field (the server makes it of a chat request's tools and tool_choice)"
            )

    def _take_reply_attributes(self) -> None:
        """What an llguidance grammar sets on the whole reply (grammars/dialects/llguidance.py)
        applied to these fields: its max_tokens bounds theirs, its temperature replaces it, its
        stop joins theirs."""
        try:
            attributes = dialects.reply_attributes(self.grammar)
        except ValueError as e:
            raise ValueError(f"SamplingParams: {e}") from None
        if attributes.max_tokens is not None:
            force_setattr(self, "max_tokens", min(self.max_tokens, attributes.max_tokens))
        if attributes.temperature is not None:
            force_setattr(self, "temperature", attributes.temperature)
        for field, value in (("stop", attributes.stop), ("stop_regex", attributes.stop_regex)):
            given = _as_tuple(getattr(self, field))
            if value is not None and value not in given:
                force_setattr(self, field, [*given, value])

    @property
    def constraint(self) -> Constraint | None:
        """The constraint as a `grammars` value (the compile cache's key), or None."""
        if self.regex is not None:
            return Regex(self.regex)
        if self.json_schema is not None:
            whitespace = COMPACT if self.json_compact else JSON_WHITESPACE
            return JsonSchema.of(self.json_schema, whitespace)
        if self.choices is not None:
            return Choices(tuple(self.choices))
        if self.grammar is not None:
            return Ebnf(self.grammar)
        if self.structural_tag is not None:
            return StructuralTag.of(self.structural_tag)
        if self.tool_calls is not None and self.json_compact:
            return dataclasses.replace(self.tool_calls, compact=True)
        return self.tool_calls

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return _as_tuple(self.stop)

    @property
    def stop_regexes(self) -> tuple[str, ...]:
        return _as_tuple(self.stop_regex)

    @property
    def wants_logprobs(self) -> bool:
        """Report each output token's logprob (top_logprobs implies it)."""
        return self.logprobs or self.top_logprobs > 0

    @property
    def has_penalties(self) -> bool:
        return (
            self.frequency_penalty != 0
            or self.presence_penalty != 0
            or self.repetition_penalty != 1
        )


def _as_tuple(value: str | list[str] | None) -> tuple[str, ...]:
    """A one-or-many field (`stop`, `stop_regex`) as a tuple."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)
