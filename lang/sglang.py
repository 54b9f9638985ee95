"""SGLang's frontend names on braid, so that its programs run with `import braid as sgl`.

Most of SGLang's API is braid's own under the same name (gen, select, system/user/assistant,
set_default_backend, the state's methods); gen, select and `run` also take SGLang's keywords
(lang/api.py maps them). This module holds the names braid has only for SGLang: @function
(whose programs follow SGLang's looser rules, see Function), aliases, the role markers as
separate calls, the backends under SGLang's names and argument names, its module-level
calls and its global_config. docs/programs.md lists them all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NoReturn

from braid.api import gen, select
from braid.interpreter.backend import Backend, default_backend, set_default_backend
from braid.interpreter.choices import greedy
from braid.interpreter.ir import Gen, Parts, Role, RoleBegin, RoleEnd, Select
from braid.interpreter.openai_backend import OpenAIBackend
from braid.interpreter.remote_backend import RemoteBackend
from braid.program import Program
from braid.runtime.text.chat_template import ChatTemplate
from braid.state import ProgramState

# SGLang's name for braid's "greedy" select method (its other two share braid's names).
greedy_token_selection = greedy


class Function(Program):
    """A program made by SGLang's @function: braid's Program with SGLang's three looser rules.

    - Calling it runs it, as SGLang's `f(question=q, temperature=0)` does (`f.run(...)`);
      `f(s, ...)` with a program state first still appends it to that state. braid's own
      @program refuses a call without a state: inside a program that is most often a
      forgotten `s`, which running a whole new program would hide.
    - A typed gen (gen_int, gen_string, dtype=, json_schema=Type) whose text does not
      decode, because max_tokens or a stop string cut it short, keeps the text as generated,
      as SGLang's variables do, where braid's own programs fail.
    - A gen that writes an assistant reply on a model that thinks keeps the thought in its
      text unless `separate_reasoning` or `reasoning=` asks for it apart (SGLang's gens do);
      braid's own programs think apart by default there.
    """

    keep_undecodable_text = True
    thinks_by_default = False  # SGLang's gens keep a thought in their text

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], ProgramState):
            return super().__call__(*args, **kwargs)
        return self.run(*args, **kwargs)


def function(
    func: Callable[..., Any] | None = None, *, num_api_spec_tokens: int | None = None
) -> Function | Callable[[Callable[..., Any]], Function]:
    """SGLang's @function (`@function()` works too): a Function."""
    if num_api_spec_tokens is not None:
        raise ValueError(
            "function(num_api_spec_tokens=...): API speculative execution is not supported; "
            "braid runs each gen as its own request"
        )
    return Function if func is None else Function(func)


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Gen:
    """gen(name, max_tokens, dtype=int, ...)."""
    return gen(name, max_tokens, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> Gen:
    """gen(name, max_tokens, dtype=str, ...): a JSON string literal, stored as the string it
    denotes."""
    return gen(name, max_tokens, dtype=str, **kwargs)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")


def image(path: Any) -> NoReturn:
    raise NotImplementedError(
        "sgl.image: braid runs text-only models (the Llama family), so a program cannot "
        "append an image"
    )


def video(path: Any, num_frames: int = 0) -> NoReturn:
    raise NotImplementedError(
        "sgl.video: braid runs text-only models (the Llama family), so a program cannot "
        "append a video"
    )


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> Any:
    """`expr` with its gens and selects made reasoning ones (`gen(..., reasoning=True)`): each
    variable gets the answer, `<name>_reasoning_content` the thought, as in SGLang.
    `model_type` (SGLang's parser name) is accepted and not needed: the backend's reasoning
    format says how the model marks a thought, and the prompt where it starts (SGLang's
    "qwen3-thinking" and "deepseek-r1" parsers differ in that alone)."""
    if expr is None:
        return ""
    if isinstance(expr, Gen):
        return Gen(expr.name, {**expr.sampling, "reasoning": True}, expr.decode, expr.lora)
    if isinstance(expr, Select):
        return select(expr.name, expr.choices, expr.method, reasoning=True)
    if isinstance(expr, Parts):
        parts = (separate_reasoning(p) if isinstance(p, Gen | Select) else p for p in expr.items)
        return Parts(tuple(parts))
    if isinstance(expr, Role):
        return Role(expr.role, separate_reasoning(Parts(expr.parts)).items, expr.thinking)
    raise TypeError(
        f"separate_reasoning(): expr must be a gen, a select, or parts holding them, got {expr!r}"
    )


class RuntimeEndpoint(RemoteBackend):
    """SGLang's name for RemoteBackend, with its arguments: programs run on a braid server.
    Roles render with the template the server reports (the served model's own), so
    `chat_template_name` is accepted and not needed."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: Any = None,
        chat_template_name: str | None = None,
    ) -> None:
        if verify is not None:
            raise ValueError("RuntimeEndpoint(verify=...): braid verifies TLS the default way")
        super().__init__(base_url, api_key)


class OpenAI(OpenAIBackend):
    """SGLang's OpenAI backend: OpenAIBackend with SGLang's arguments. `base_url` and
    `api_key` default to $OPENAI_BASE_URL (else OpenAI's API) and $OPENAI_API_KEY, as the
    openai client's do. A chat model gets messages (/chat/completions); `is_chat_model=False`
    sends text to /completions, with roles rendered by `chat_template` (a braid
    ChatTemplate) when one is given."""

    def __init__(
        self,
        model_name: str,
        is_chat_model: bool | None = None,
        chat_template: ChatTemplate | None = None,
        is_azure: bool = False,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        if is_azure:
            raise ValueError("OpenAI(is_azure=True): Azure's API is not supported")
        if is_chat_model and chat_template is not None:
            raise ValueError(
                "OpenAI(): a chat model renders its own roles; give chat_template only with "
                "is_chat_model=False"
            )
        if is_chat_model is False and chat_template is None:
            chat_template = ChatTemplate({}, {}, {})  # no roles: plain text completions
        base_url = base_url or os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        super().__init__(base_url, model_name, api_key, chat_template, timeout)


def flush_cache(backend: Backend | None = None) -> bool:
    """Drop the cached prefixes of `backend` (the default one if None): a local engine's, or
    a braid server's through /flush_cache. True once done; a backend without a cache to
    flush raises NotImplementedError."""
    (backend or default_backend()).flush_cache()
    return True


def get_server_info(backend: Backend | None = None) -> dict:
    """The configuration and counters of `backend` (the default one if None): a local
    engine's, or a braid server's /get_server_info; a backend that cannot report them raises
    NotImplementedError."""
    return (backend or default_backend()).get_server_info()


# Settings SGLang lets programs change that braid implements one way only.
_FIXED_SETTINGS = {
    "skip_special_tokens_in_output": True,
    "spaces_between_special_tokens_in_out": True,
}


class GlobalConfig:
    """SGLang's `sgl.global_config`. `default_backend` is braid's default backend (reading it
    makes the default one, as running a program would). The output settings keep the only
    values braid implements; the others are accepted and have no effect: `verbosity`, and
    the interpreter optimisations `enable_precache_with_tracing` and
    `enable_parallel_encoding` (braid's radix cache shares prefixes without them)."""

    def __init__(self) -> None:
        self.verbosity = 0
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True

    @property
    def default_backend(self) -> Backend:
        return default_backend()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        set_default_backend(backend)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED_SETTINGS and value != _FIXED_SETTINGS[name]:
            raise ValueError(f"global_config.{name}: braid implements {_FIXED_SETTINGS[name]} only")
        if name not in _SETTINGS:
            raise AttributeError(f"global_config has no {name!r}; it has {sorted(_SETTINGS)}")
        super().__setattr__(name, value)


_SETTINGS = frozenset(
    {
        "default_backend",
        "verbosity",
        "enable_precache_with_tracing",
        "enable_parallel_encoding",
        *_FIXED_SETTINGS,
    }
)

global_config = GlobalConfig()
