"""braid: @program functions that mix text with gen, select, fork and chat roles, run on
braid's own engine (the default) or on a server.

    from braid import program, gen, select, user, assistant

SGLang's frontend programs run unchanged with `import braid as sgl` (braid.sglang holds the
names braid has only for them). Names load on first use: `import braid` needs neither torch
nor transformers until a program runs on the local engine.
"""

from typing import TYPE_CHECKING

from braid._lazy import lazy_exports

_EXPORTS = {
    "Backend": "braid.interpreter.backend",
    "set_default_backend": "braid.interpreter.backend",
    "token_length_normalized": "braid.interpreter.choices",
    "unconditional_likelihood_normalized": "braid.interpreter.choices",
    "ProgramError": "braid.interpreter.executor",
    "LocalBackend": "braid.interpreter.local_backend",
    "OpenAIBackend": "braid.interpreter.openai_backend",
    "RayBackend": "braid.interpreter.ray_backend",
    "RemoteBackend": "braid.interpreter.remote_backend",
    "assistant": "braid.api",
    "gen": "braid.api",
    "select": "braid.api",
    "system": "braid.api",
    "user": "braid.api",
    # grammars composed in Python, for gen(grammar=...)
    "capture": "braid.compose",
    "json": "braid.compose",
    "one_of": "braid.compose",
    "one_or_more": "braid.compose",
    "optional": "braid.compose",
    "regex": "braid.compose",
    "substring": "braid.compose",
    "zero_or_more": "braid.compose",
    "Program": "braid.program",
    "program": "braid.program",
    "ForkList": "braid.state",
    "ProgramState": "braid.state",
    # SGLang's names
    "OpenAI": "braid.sglang",
    "RuntimeEndpoint": "braid.sglang",
    "assistant_begin": "braid.sglang",
    "assistant_end": "braid.sglang",
    "flush_cache": "braid.sglang",
    "function": "braid.sglang",
    "gen_int": "braid.sglang",
    "gen_string": "braid.sglang",
    "get_server_info": "braid.sglang",
    "global_config": "braid.sglang",
    "greedy_token_selection": "braid.sglang",
    "image": "braid.sglang",
    "separate_reasoning": "braid.sglang",
    "system_begin": "braid.sglang",
    "system_end": "braid.sglang",
    "user_begin": "braid.sglang",
    "user_end": "braid.sglang",
    "video": "braid.sglang",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load lazily
    from braid.api import assistant, gen, select, system, user
    from braid.compose import (
        capture,
        json,
        one_of,
        one_or_more,
        optional,
        regex,
        substring,
        zero_or_more,
    )
    from braid.interpreter.backend import Backend, set_default_backend
    from braid.interpreter.choices import (
        token_length_normalized,
        unconditional_likelihood_normalized,
    )
    from braid.interpreter.executor import ProgramError
    from braid.interpreter.local_backend import LocalBackend
    from braid.interpreter.openai_backend import OpenAIBackend
    from braid.interpreter.ray_backend import RayBackend
    from braid.interpreter.remote_backend import RemoteBackend
    from braid.program import Program, program
    from braid.sglang import (
        OpenAI,
        RuntimeEndpoint,
        assistant_begin,
        assistant_end,
        flush_cache,
        function,
        gen_int,
        gen_string,
        get_server_info,
        global_config,
        greedy_token_selection,
        image,
        separate_reasoning,
        system_begin,
        system_end,
        user_begin,
        user_end,
        video,
    )
    from braid.state import ForkList, ProgramState
