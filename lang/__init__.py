"""What users import: @program functions that mix text with gen, select, fork and roles."""

from interpreter.backend import Backend, set_default_backend
from interpreter.executor import ProgramError
from interpreter.local_backend import LocalBackend
from interpreter.openai_backend import OpenAIBackend
from interpreter.remote_backend import RemoteBackend
from lang.api import assistant, gen, select, system, user
from lang.program import Program, program
from lang.state import ForkList, ProgramState

__all__ = [
    "Backend",
    "ForkList",
    "LocalBackend",
    "OpenAIBackend",
    "Program",
    "ProgramError",
    "ProgramState",
    "RemoteBackend",
    "assistant",
    "gen",
    "program",
    "select",
    "set_default_backend",
    "system",
    "user",
]
