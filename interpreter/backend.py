"""What the interpreter and the frontend need from a model: the `Backend` protocol.

`LocalBackend` runs an in-process Engine; `RemoteBackend` a braid server, `OpenAIBackend` any
OpenAI-compatible API, `RayBackend` engines in Ray actors. Every backend implements every
member; where one cannot do a thing, its member says so as the member's contract states (a
"not available" value, doing nothing, or an error naming the backend), so no caller probes
for a member. `TextOnlyBackend` holds those answers for a backend that sees only text.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from braid.interpreter.local_backend import LocalBackend
from braid.runtime.protocol import GenerateOutput, SamplingParams
from braid.runtime.text.chat_template import ChatTemplate

if TYPE_CHECKING:  # the format's module loads transformers: remote programs do without it
    from braid.runtime.text.generation_openings import GenerationOpenings
    from braid.runtime.text.reasoning import ReasoningFormat


class Backend(Protocol):
    @property
    def chat_template(self) -> ChatTemplate:
        """The markers that render chat roles as text. Raises ValueError when the model has
        no chat template (the roles cannot be rendered)."""

    @property
    def generation_openings(self) -> GenerationOpenings | None:
        """How the template's generation prompt opens an assistant message the model writes
        (by thinking setting); None where the backend cannot tell, and such a message then
        opens as `chat_template` opens a history turn."""

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        """How the model marks a thought (runtime/text/reasoning.py); None for a model that
        does not think. Raises NotImplementedError, naming the backend, where it cannot tell
        (a reasoning gen cannot run there)."""

    @property
    def heals_prompts(self) -> bool:
        """Whether its gens honour SamplingParams.token_healing. Where not, a program's gens
        run unhealed by default and one that asks for healing raises."""

    async def generate(
        self,
        prompt: str,
        params: SamplingParams,
        on_text: Callable[[str], None],
        lora: str | None = None,
        program: str | None = None,
    ) -> GenerateOutput:
        """Generate a continuation of `prompt`, handing each new piece of text to `on_text`
        as it arrives. Raises RuntimeError when the request fails. `lora`: a LoRA adapter the
        model serves, by name (None: the base model). `program`: the id of the program state
        the request belongs to; a backend that keeps leases keeps that state's prefix cached
        until `release_program`, one that keeps none ignores it.

        With `params.reasoning` the output's `meta` also holds it split in the model's
        reasoning format, from where the prompt leaves the model: "reasoning_content" (the
        thought, without its markers) and "content" (the answer after it); the output's text
        stays as the model wrote it."""

    async def score(
        self, prefix: str, continuations: list[str], lora: str | None = None
    ) -> list[list[float]]:
        """For each continuation, the logprobs of its tokens after `prefix`, all counted from
        the first token position where any of them departs from the prefix's tokens."""

    def compile_ahead(self, params: SamplingParams) -> None:
        """Start compiling the params' constraint now, so its gen finds it compiled; returns
        at once. It may raise for a constraint that cannot compile: the caller ignores that
        (the gen fails in its turn). A backend that cannot compile ahead does nothing."""

    async def release_program(self, program: str, lora: str | None = None) -> None:
        """Program state `program` (under `lora`) will not continue: drop its lease. Never
        raises (without it the lease expires). A backend that keeps no leases does nothing."""

    def token_texts(self, token_ids: list[int]) -> list[str | None]:
        """Each token's own text; None for a token whose text the backend cannot tell."""

    def token_pieces(self, prompt: str, token_ids: list[int], healed: str = "") -> list[str] | None:
        """The text each output token added after `prompt`, as it was streamed (a token that
        ends inside a character adds "", the next one the character; `healed`, the prompt's
        end that token healing took off, left out as the output leaves it out); None where
        the backend cannot split its output by token."""

    def prompt_chars(self, prompt: str, num_tokens: int) -> int | None:
        """How many characters of `prompt` its first `num_tokens` tokens spell; None where
        the backend cannot tell."""

    def flush_cache(self) -> None:
        """Drop the cached prefixes. Raises NotImplementedError, naming the backend, where
        there is no cache it can flush."""

    def get_server_info(self) -> dict:
        """The engine's (or server's) configuration and counters. Raises
        NotImplementedError, naming the backend, where it cannot report them."""


class TextOnlyBackend:
    """The members beyond text of a backend that has neither the model's tokenizer at hand
    nor a runtime that takes a program's hints: OpenAIBackend (an API that speaks text) and
    RayBackend (its engines are in actors, each request routed on its own). Token texts,
    pieces and prompt offsets are not available; nothing compiles ahead; no lease is kept,
    so none is released; the template's generation prompt and the model's reasoning format
    are not known; the prompt is not token-healed (that takes the model's tokens)."""

    heals_prompts = False

    @property
    def generation_openings(self) -> GenerationOpenings | None:
        """Not available: None."""
        return None

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        raise NotImplementedError(
            f"{type(self).__name__} cannot run a reasoning gen: it does not know the model's "
            "reasoning format (a LocalBackend does)"
        )

    def compile_ahead(self, params: SamplingParams) -> None:
        """Does nothing: the constraint compiles when its gen runs."""

    async def release_program(self, program: str, lora: str | None = None) -> None:
        """Does nothing: no lease was kept."""

    def token_texts(self, token_ids: list[int]) -> list[str | None]:
        """Not available: None for each token."""
        return [None] * len(token_ids)

    def token_pieces(self, prompt: str, token_ids: list[int], healed: str = "") -> list[str] | None:
        """Not available: None."""
        return None

    def prompt_chars(self, prompt: str, num_tokens: int) -> int | None:
        """Not available: None."""
        return None


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
            _default = LocalBackend.start()
        return _default
