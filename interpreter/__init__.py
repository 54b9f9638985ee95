"""Runs programs: each state's operations on an event loop, against a backend that turns
gens into engine requests and selects into request trees."""

from interpreter.backend import Backend, default_backend, set_default_backend
from interpreter.executor import ProgramError, StreamExecutor
from interpreter.local_backend import LocalBackend
from interpreter.openai_backend import OpenAIBackend
from interpreter.remote_backend import RemoteBackend
from runtime.chat_template import ChatTemplate

__all__ = [
    "Backend",
    "ChatTemplate",
    "LocalBackend",
    "OpenAIBackend",
    "ProgramError",
    "RemoteBackend",
    "StreamExecutor",
    "default_backend",
    "set_default_backend",
]
