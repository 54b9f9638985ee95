"""instructor over the official openai client against `braid serve` (argv[1]), extracting a
pydantic model in Mode.TOOLS and Mode.JSON_SCHEMA: instructor validates it (no retries)."""

from __future__ import annotations

import sys
from typing import Literal

import instructor
from _record import Sent, emit
from openai import OpenAI
from pydantic import BaseModel, Field


class City(BaseModel):
    name: str = Field(max_length=12)
    country: Literal["France", "Spain", "Italy"]
    population: int = Field(ge=0, le=10_000_000)


sent = Sent()
openai = OpenAI(
    base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, http_client=sent.client()
)
result = {"version": instructor.__version__}
for mode in ("TOOLS", "JSON_SCHEMA"):
    client = instructor.from_openai(openai, mode=getattr(instructor.Mode, mode))
    city, completion = client.chat.completions.create_with_completion(
        model="tiny",
        response_model=City,
        max_retries=0,
        max_tokens=128,
        temperature=0,
        messages=[{"role": "user", "content": "Describe Paris."}],
    )
    message = completion.choices[0].message
    raw = message.tool_calls[0].function.arguments if message.tool_calls else message.content
    result[mode] = {"city": city.model_dump(), "raw": raw, "sent": sent.take()}
emit(result)
