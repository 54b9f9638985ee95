"""A pydantic-ai Agent with one tool and a pydantic output_type, run against `braid serve`
(argv[1]) through its OpenAI provider (OpenAIChatModel): the first step must call the tool,
the next must give the output (per-step tool_choice, as pydantic-ai documents it)."""

from __future__ import annotations

import sys
from importlib.metadata import version
from typing import Annotated, Literal

from _record import Sent, emit
from openai import AsyncOpenAI
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ToolOrOutput
from pydantic_ai.usage import UsageLimits


class Forecast(BaseModel):
    city: str = Field(max_length=12)
    sky: Literal["sunny", "rainy", "cloudy"]


def settings(ctx):
    choice = ["get_weather"] if ctx.run_step <= 1 else ToolOrOutput(function_tools=[])
    return {"max_tokens": 128, "temperature": 0, "tool_choice": choice}


sent = Sent()
client = AsyncOpenAI(
    base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, http_client=sent.async_client()
)
model = OpenAIChatModel("tiny", provider=OpenAIProvider(openai_client=client))
agent = Agent(model, output_type=Forecast, model_settings=settings)
calls: list[str] = []


@agent.tool_plain
def get_weather(city: Annotated[str, Field(max_length=10)]) -> str:
    """Current weather in a city."""
    calls.append(city)
    return "sunny"


run = agent.run_sync("What is the weather in Paris?", usage_limits=UsageLimits(request_limit=4))
emit(
    {
        "version": version("pydantic-ai-slim"),
        "output": run.output.model_dump(),
        "calls": calls,
        "requests": run.usage.requests,
        "sent": sent.take(),
    }
)
