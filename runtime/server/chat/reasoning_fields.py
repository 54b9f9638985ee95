"""What a conversational request asks of the model's thought, read from each API's fields
into one Thinking: its budget (one per request, whichever field gave it), the effort the
chat template is told, whether the thought is off, and how it comes back.

Budgets are thought tokens (the end marker aside); 0 turns thinking off. Efforts map to
budgets by EFFORT_BUDGETS and are also passed to the chat template as `reasoning_effort`
(GPT-OSS's template writes it into its system message). Thinking off also sets the
template's `enable_thinking` to false (Qwen3's and SmolLM3's templates then write an empty
thought or a /no_think mode), unless the request's chat_template_kwargs set it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from braid.runtime.server.wire import BadRequest, ChatCompletionRequest

# reasoning_effort (chat completions) and reasoning.effort (Responses) as thinking budgets.
EFFORT_BUDGETS: dict[str, int] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": 16384,
}


@dataclass(frozen=True)
class Thinking:
    """A request's asks of the thought. `budget_field` names the field that gave the budget
    (in errors); `switch` False (chat's `reasoning: false`) runs the request as if the model
    had no reasoning format; `separate` False leaves the thought inline in the text as the
    model wrote it; `whole` streams the thought in one piece once it has ended; `include`
    False drops it from the reply."""

    budget: int | None = None
    budget_field: str | None = None
    budget_mode: str | None = None  # "soft" or "hard"; None: SamplingParams' default
    effort: str | None = None
    switch: bool | None = None
    separate: bool = True
    whole: bool = False
    include: bool = True

    @property
    def off(self) -> bool:
        return self.budget == 0

    def template_variables(self, given: dict[str, Any]) -> dict[str, Any]:
        """The chat template's variables: the request's own (`given`, which win), with the
        effort and, when thinking is off, enable_thinking false."""
        ours: dict[str, Any] = {}
        if self.effort is not None:
            ours["reasoning_effort"] = self.effort
        if self.off:
            ours["enable_thinking"] = False
        return ours | given


def one_budget(given: dict[str, int | None]) -> tuple[int | None, str | None]:
    """(the budget, the field that gave it) of a request's budget fields (`given`: field ->
    its budget, None where absent); two that disagree are a 400 naming both."""
    named = [(field, budget) for field, budget in given.items() if budget is not None]
    for field, budget in named[1:]:
        if budget != named[0][1]:
            first, first_budget = named[0]
            raise BadRequest(
                f"{first} ({first_budget}) and {field} ({budget}) ask for different thinking "
                "budgets: give one"
            )
    if not named:
        return None, None
    field, budget = named[0]
    return budget, field


def effort_budget(field: str, effort: str | None) -> int | None:
    """The budget an effort maps to (None: no effort given)."""
    if effort is None:
        return None
    if effort not in EFFORT_BUDGETS:
        raise BadRequest(f"{field} must be one of {', '.join(EFFORT_BUDGETS)}; got {effort!r}")
    return EFFORT_BUDGETS[effort]


def chat_thinking(req: ChatCompletionRequest) -> Thinking:
    """A chat completion's thinking fields: vLLM's thinking_token_budget, braid's
    thinking_budget, max_thinking_tokens, SGLang's custom_params.thinking_budget and
    OpenAI's reasoning_effort; SGLang's separate_reasoning and stream_reasoning, and
    include_reasoning."""
    custom = dict(req.custom_params or {})
    custom_budget = custom.pop("thinking_budget", None)
    if custom:
        raise BadRequest(
            f"custom_params.{sorted(custom)[0]} is not supported (braid reads "
            "custom_params.thinking_budget only)"
        )
    if custom_budget is not None and (
        not isinstance(custom_budget, int) or isinstance(custom_budget, bool) or custom_budget < 0
    ):
        raise BadRequest("custom_params.thinking_budget must be an integer >= 0")
    budget, field = one_budget(
        {
            "thinking_token_budget": req.thinking_token_budget,
            "thinking_budget": req.thinking_budget,
            "max_thinking_tokens": req.max_thinking_tokens,
            "custom_params.thinking_budget": custom_budget,
            "reasoning_effort": effort_budget("reasoning_effort", req.reasoning_effort),
        }
    )
    return Thinking(
        budget=budget,
        budget_field=field,
        budget_mode=req.thinking_budget_mode,
        effort=req.reasoning_effort,
        switch=req.reasoning,
        separate=req.separate_reasoning,
        whole=not req.stream_reasoning,
        include=req.include_reasoning,
    )
