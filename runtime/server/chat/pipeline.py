"""The conversation pipeline: a ConversationRequest made ready to run, once for every
conversational route (chat completions, Responses, Messages).

In order: the tools planned against tool_choice, the request's text checked by its length,
the conversation rendered through the chat template with its variables (the request's, and
those its thinking fields set; tools, calls and results as tools.conversation writes them)
and a prefill appended, the prompt encoded and checked against the context, max tokens
bounded, the thought asked for (where the model has a reasoning format: the output may think
first, within the request's budget, and the constraint holds the answer after it), the tool
constraint put on the params, the params compiled; then each sample streamed under the
request's context, ending at a repeated call, and read by a Reply, which splits the thought
off where the prompt left the model (prompt_opening) before it reads the text for calls.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec
from starlette.requests import Request

from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.chat import tools
from braid.runtime.server.chat.conversation import Conversation, ConversationRequest
from braid.runtime.server.chat.reply import Reply, Split
from braid.runtime.server.chat.tools import ToolPlan
from braid.runtime.server.http.limits import check_max_tokens
from braid.runtime.server.request_context import RequestContext
from braid.runtime.server.service import Service, Streamer, samples
from braid.runtime.server.wire import BadRequest
from braid.runtime.text.reasoning import prompt_opening


@dataclass(frozen=True)
class Prepared:
    """A conversation request ready to run: its prompt, its params (thinking where the model
    does, constrained to the tool plan, compiled), and the streamer of its samples."""

    ids: list[int]
    params: SamplingParams  # n samples: see `jobs`
    plan: ToolPlan | None
    stream: Streamer  # Service.stream under the request's context, ending at a repeated call
    max_tokens_cut: bool  # fit_max_tokens cut max_tokens to the room the prompt leaves
    split: Split | None = None  # a reasoning request's: how its output splits

    @property
    def jobs(self) -> list[tuple[list[int], SamplingParams]]:
        """One job per sample (Service.samples)."""
        return [(self.ids, p) for p in samples(self.params)]

    def reply(self) -> Reply:
        """A reader of one sample's output."""
        return Reply(self.plan, self.split)


async def prompt(svc: Service, conv: Conversation) -> tuple[list[int], ToolPlan | None]:
    """The conversation's prompt tokens (not yet checked against the context: `prepare`
    encodes them) and its tool plan (None without tools)."""
    plan = tools.plan(conv)
    if conv.prefill and plan is not None and plan.calls:
        raise BadRequest(
            "a final assistant message (a prefill) cannot be continued while the reply may "
            "call tools: give tool_choice {'type': 'none'} or leave the prefill out"
        )
    # Tools and calls too (tools.rendered_chars), before anything is rendered.
    svc.check_text_length(tools.rendered_chars(conv) + len(conv.prefill), conv.named_as)
    variables = conv.thinking.template_variables(svc.template_variables(conv.template_variables))
    if tools.uses_tools(conv):
        system_role = svc.chat_template is not None and "system" in svc.chat_template.closing
        messages, tool_list = tools.conversation(conv, svc.tools_in_template, system_role)
        ids = await svc.render_chat(messages, variables, tool_list)
    else:
        ids = await svc.render_chat([m.as_dict() for m in conv.messages], variables)
    if conv.prefill:
        encode = functools.partial(
            svc.engine.tokenizer.encode, conv.prefill, add_special_tokens=False
        )
        ids += await svc.off_loop(encode)
    return ids, plan


async def prepare(
    svc: Service, ctx: RequestContext, req: ConversationRequest, client: Request
) -> Prepared:
    """The request checked, rendered, encoded, bounded, constrained and compiled: every 400
    and 503 it can get before its response starts (`client`: the HTTP request, whose leaving
    gives up the compiles)."""
    params = req.params
    svc.check_room(params.n)
    ids, plan = await prompt(svc, req.conversation)
    ids = await svc.encode(ids)  # checked against the context and --max-prompt-tokens
    context, cut = svc.engine.context_length, False
    if req.max_tokens_field is not None:
        check_max_tokens(req.max_tokens_field, params.max_tokens, len(ids), context)
    elif req.fit_max_tokens and params.max_tokens > context - len(ids):
        params, cut = msgspec.structs.replace(params, max_tokens=context - len(ids)), True
    params, split = _thinking(svc, req.conversation, params, ids, plan)
    # The output may be calls: constrained (the engine compiles a harmony model's calls to
    # harmony's format) and parsed.
    calling = plan is not None and plan.calls
    if calling:
        params = tools.constrain(plan, params)
    await svc.check_params(params, client)
    # Several Hermes calls may repeat themselves: such outputs end at the first repeat (a
    # harmony reply is one call).
    repeats = calling and plan.parallel and not (split and split.fmt.kind == "harmony")
    stream = (
        _ended_at_repeat(svc, ctx, lambda: Reply(plan, split)) if repeats else svc.streamer(ctx)
    )
    return Prepared(ids, params, plan, stream, cut, split)


def _thinking(
    svc: Service,
    conv: Conversation,
    params: SamplingParams,
    ids: list[int],
    plan: ToolPlan | None,
) -> tuple[SamplingParams, Split | None]:
    """The params of a request on a model with a reasoning format (unless the request turns
    it off: chat's `reasoning: false`): the output may think first, within the request's
    budget; and how its output splits, from where the prompt `ids` leaves the model. A
    budget for a model without one is a 400 naming its field."""
    thinking, fmt = conv.thinking, svc.engine.reasoning_format
    if fmt is None or thinking.switch is False:
        if thinking.budget:  # 0 (thinking off) asks nothing of a model that does not think
            why = "this model has no reasoning format" if fmt is None else "reasoning is false"
            raise BadRequest(
                f"{thinking.budget_field}: {why}, so there is no thought to budget (braid serve "
                "--reasoning-format names the model's format)"
            )
        if fmt is not None and fmt.kind == "harmony" and plan is not None and plan.calls:
            raise BadRequest(
                "reasoning false cannot be combined with tools that may be called on a harmony "
                "model: its calls are read from its channels"
            )
        return params, None
    if not thinking.separate and plan is not None and plan.calls:
        raise BadRequest(
            "separate_reasoning false cannot be combined with tools that may be called (calls "
            "are read from the text after the thought)"
        )
    split = Split(fmt, prompt_opening(fmt, svc.engine.tokenizer, ids), thinking)
    if split.closed:  # the prompt closed the thought: the model answers as one that never thinks
        return params, split
    fields = {"reasoning": True, "thinking_budget": thinking.budget}
    if thinking.budget_mode is not None:
        fields["thinking_budget_mode"] = thinking.budget_mode
    return msgspec.structs.replace(params, **fields), split


def _ended_at_repeat(svc: Service, ctx: RequestContext, reply: Callable[[], Reply]) -> Streamer:
    """svc.stream for outputs that may be several calls: the request is aborted as soon as
    its output repeats a call (read as the route reads it: `reply()`, its thought split off
    first), and its last chunk then says "stop"."""

    async def stream(ids: list[int], params: SamplingParams) -> AsyncIterator[StreamChunk]:
        rid: list[int] = []
        watch = reply()
        async for chunk in svc.stream(ids, params, ctx, on_submit=rid.append):
            if not watch.repeated:
                watch.read(chunk.text)
                if watch.repeated:
                    svc.engine.abort(rid[0])
            if watch.repeated and chunk.finish_reason == "abort" and chunk.error is None:
                chunk = dataclasses.replace(chunk, finish_reason="stop")
            yield chunk

    return stream
