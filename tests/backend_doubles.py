"""A base for the tests' scripted backends, which script only `chat_template`, `generate`
and `score`: the other Backend members answer as a backend that sees only text does
(interpreter/backend.py), so the interpreter runs on them as on any backend."""

from __future__ import annotations

from braid.interpreter.backend import TextOnlyBackend


class ScriptedBase(TextOnlyBackend):
    def flush_cache(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot flush_cache: it is scripted")

    def get_server_info(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} cannot get_server_info: it is scripted")
