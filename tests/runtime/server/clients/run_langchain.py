"""langchain-openai's ChatOpenAI against `braid serve` (argv[1]): with_structured_output of
a pydantic model (its default method, json_schema, and function_calling) and bind_tools with
a named and a required tool_choice."""

from __future__ import annotations

import sys
from importlib.metadata import version
from typing import Annotated, Literal

from _record import Sent, emit
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


class City(BaseModel):
    """A city."""

    name: str = Field(max_length=12)
    country: Literal["France", "Spain", "Italy"]


@tool
def get_weather(
    city: Annotated[str, Field(max_length=10)], unit: Literal["celsius", "fahrenheit"]
) -> str:
    """Current weather in a city."""
    return "sunny"


sent = Sent()
llm = ChatOpenAI(
    model="tiny",
    base_url=sys.argv[1] + "/v1",
    api_key="unused",
    max_tokens=128,
    temperature=0,
    max_retries=0,
    http_client=sent.client(),
)
result = {"version": version("langchain-openai")}
for method in ("json_schema", "function_calling"):
    out = llm.with_structured_output(City, method=method, include_raw=True).invoke("Paris")
    assert out["parsing_error"] is None, out["parsing_error"]
    result[method] = {"parsed": out["parsed"].model_dump(), "sent": sent.take()}
for choice in ("get_weather", "required"):
    message = llm.bind_tools([get_weather], tool_choice=choice).invoke("Weather in Paris?")
    result["tools_" + choice] = {
        "tool_calls": message.tool_calls,
        "finish_reason": message.response_metadata.get("finish_reason"),
        "sent": sent.take(),
    }
emit(result)
