"""How a gen's assistant reply opens on a model that may think: the generation prompt it
opens with (thinking on, off, or as the template's default), and whether the gen then thinks
apart by default."""

from __future__ import annotations

from typing import Any

import msgspec

from braid.interpreter.backend import Backend
from braid.interpreter.ir import Gen, RoleBegin
from braid.runtime.protocol import SamplingParams


def generation_opening(backend: Backend, op: RoleBegin, as_history: str, first: bool) -> str:
    """The opening of `op`'s message where a gen writes its first text."""
    if op.role != "assistant" or (first and op.thinking is None):
        return as_history  # with nothing before it, a template renders no generation prompt
    if first:
        raise ValueError(
            f"assistant(thinking={op.thinking}): a message that opens the conversation has "
            "no generation prompt to set thinking in; put a user message before it"
        )
    openings = backend.generation_openings
    if openings is None:
        if op.thinking is None:
            return as_history
        raise NotImplementedError(
            f"assistant(thinking={op.thinking}): {type(backend).__name__} cannot tell "
            "how the model's chat template opens a generation (a LocalBackend can)"
        )
    return openings.opening(op.thinking)


def reply_params(
    backend: Backend, op: Gen, params: SamplingParams, run_sampling: dict[str, Any], text: str
) -> SamplingParams:
    """The params of gen `op`, which opens an assistant reply ending `text`: a reasoning gen
    where it and the run leave `reasoning` unset, the model has a reasoning format, and the
    opening does not close the thought."""
    if "reasoning" in op.sampling or "reasoning" in run_sampling:
        return params
    try:
        fmt = backend.reasoning_format
    except NotImplementedError:  # a backend that cannot tell: as it ran before
        return params
    if fmt is None or fmt.opening(text[-200:]) == "off":
        return params
    return msgspec.structs.replace(params, reasoning=True)


def check_reasoning(backend: Backend, op: Gen, params: SamplingParams) -> None:
    """ValueError for a reasoning gen on a model that does not think."""
    if params.reasoning and backend.reasoning_format is None:
        raise ValueError(
            f"gen({op.name!r}): reasoning needs a model that thinks, and the model of this "
            f"{type(backend).__name__} has no reasoning format (its tokenizer and chat "
            "template show no think tags or harmony channels)"
        )
