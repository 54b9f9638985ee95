"""The OpenAI Agents SDK against `braid serve` (argv[1]): an Agent with a function tool and an
output_type, run on OpenAIChatCompletionsModel and on OpenAIResponsesModel. tool_choice names
the tool; the SDK resets it after the call (reset_tool_choice), so the next turn gives the
output. Tracing is off: nothing but braid is called."""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version
from typing import Annotated, Literal

from _record import Sent, emit
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

set_tracing_disabled(True)


class Forecast(BaseModel):
    city: str = Field(max_length=12)
    sky: Literal["sunny", "rainy", "cloudy"]


calls: list[str] = []


@function_tool
def get_weather(city: Annotated[str, Field(max_length=10)]) -> str:
    """Current weather in a city."""
    calls.append(city)
    return "sunny"


async def main(url: str) -> dict:
    sent = Sent()
    client = AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, http_client=sent.async_client()
    )
    result = {"version": version("openai-agents")}
    for name, model in (
        ("chat", OpenAIChatCompletionsModel(model="tiny", openai_client=client)),
        ("responses", OpenAIResponsesModel(model="tiny", openai_client=client)),
    ):
        agent = Agent(
            name="weather",
            instructions="Give the forecast.",
            model=model,
            tools=[get_weather],
            output_type=Forecast,
            model_settings=ModelSettings(tool_choice="get_weather", max_tokens=128, temperature=0),
        )
        run = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        result[name] = {
            "output": run.final_output.model_dump(),
            "calls": calls[:],
            "items": [item.type for item in run.new_items],
            "sent": sent.take(),
        }
        calls.clear()
    return result


emit(asyncio.run(main(sys.argv[1])))
