"""Runs programs: each state's operations on an event loop, against a backend that turns
gens into engine requests and selects into request trees."""

from braid.interpreter.backend import (
    Backend,
    TextOnlyBackend,
    default_backend,
    set_default_backend,
)
from braid.interpreter.executor import ProgramError, StreamExecutor
from braid.interpreter.local_backend import LocalBackend
from braid.interpreter.openai_backend import OpenAIBackend
from braid.interpreter.ray_backend import RayBackend
from braid.interpreter.remote_backend import RemoteBackend
from braid.runtime.text.chat_template import ChatTemplate

__all__ = [
    "Backend",
    "ChatTemplate",
    "LocalBackend",
    "OpenAIBackend",
    "ProgramError",
    "RayBackend",
    "RemoteBackend",
    "StreamExecutor",
    "TextOnlyBackend",
    "default_backend",
    "set_default_backend",
]
