"""braid: @program functions that mix text with gen, select, fork and chat roles, run on
braid's own engine (the default) or on a server.

    from braid import program, gen, select, user, assistant

Names load on first use: `import braid` needs neither torch nor transformers until a
program runs on the local engine.
"""

from typing import TYPE_CHECKING

from braid._lazy import lazy_exports

_EXPORTS = {
    "Backend": "braid.interpreter.backend",
    "set_default_backend": "braid.interpreter.backend",
    "ProgramError": "braid.interpreter.executor",
    "LocalBackend": "braid.interpreter.local_backend",
    "OpenAIBackend": "braid.interpreter.openai_backend",
    "RemoteBackend": "braid.interpreter.remote_backend",
    "assistant": "braid.api",
    "gen": "braid.api",
    "select": "braid.api",
    "system": "braid.api",
    "user": "braid.api",
    "Program": "braid.program",
    "program": "braid.program",
    "ForkList": "braid.state",
    "ProgramState": "braid.state",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load lazily
    from braid.api import assistant, gen, select, system, user
    from braid.interpreter.backend import Backend, set_default_backend
    from braid.interpreter.executor import ProgramError
    from braid.interpreter.local_backend import LocalBackend
    from braid.interpreter.openai_backend import OpenAIBackend
    from braid.interpreter.remote_backend import RemoteBackend
    from braid.program import Program, program
    from braid.state import ForkList, ProgramState
