"""What the interpreter needs from a model: generate text, score continuations, and the
chat template's markers. `LocalBackend` runs an in-process Engine; remote backends (a braid
server, an OpenAI-compatible API) implement the same three members.

LocalBackend and RemoteBackend also offer what SGLang's frontend asks of a backend:
`token_texts(ids)` (for get_meta_info's logprob listings), `flush_cache()` and
`get_server_info()`; a backend without them leaves texts out or says it cannot. They also
take what the interpreter tells a runtime about a program (interpreter/executor.py): a
state's id on its gens (`generate(..., program=id)`), `release_program(id)` when it is done,
and `compile_ahead(params)` when a constrained gen is submitted."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Protocol

from braid.interpreter.local_backend import LocalBackend
from braid.runtime.protocol.outputs import GenerateOutput
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.text.chat_template import ChatTemplate


class Backend(Protocol):
    @property
    def chat_template(self) -> ChatTemplate: ...

    async def generate(
        self,
        prompt: str,
        params: SamplingParams,
        on_text: Callable[[str], None],
        lora: str | None = None,
    ) -> GenerateOutput:
        """Generate a continuation of `prompt`, handing each new piece of text to `on_text`
        as it arrives. Raises RuntimeError when the request fails. `lora`: a LoRA adapter the
        model serves, by name (the interpreter passes it only to programs that ask for one,
        so a backend without adapters may leave it out)."""

    async def score(
        self, prefix: str, continuations: list[str], lora: str | None = None
    ) -> list[list[float]]:
        """For each continuation, the logprobs of its tokens after `prefix`, all counted from
        the first token position where any of them departs from the prefix's tokens."""


_default: Backend | None = None
_default_lock = threading.Lock()


def set_default_backend(backend) -> None:
    """Use this backend (or an Engine, wrapped in a LocalBackend) for programs run without
    one."""
    global _default
    with _default_lock:
        # Only a loaded engine module can have made an Engine: remote-only programs never
        # import it (nor torch).
        engine = sys.modules.get("braid.runtime.engine.engine")
        is_engine = engine is not None and isinstance(backend, engine.Engine)
        _default = LocalBackend(backend) if is_engine else backend


def default_backend() -> Backend:
    """The default backend; a LocalBackend on the default model is made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            from braid.runtime.engine.engine import Engine

            _default = LocalBackend(Engine())
        return _default
