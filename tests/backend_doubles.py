"""A base for the tests' scripted backends, which script only `chat_template`, `generate`
and `score`: every other Backend member answers as a backend without that capability does
(interpreter/backend.py), so the interpreter runs on them as on any backend."""

from __future__ import annotations


class ScriptedBase:
    def compile_ahead(self, params) -> None:
        pass

    async def release_program(self, program: str, lora: str | None = None) -> None:
        pass

    def token_texts(self, token_ids: list[int]) -> list[str | None]:
        return [None] * len(token_ids)

    def token_pieces(self, prompt: str, token_ids: list[int]) -> list[str] | None:
        return None

    def prompt_chars(self, prompt: str, num_tokens: int) -> int | None:
        return None

    def flush_cache(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot flush_cache: it is scripted")

    def get_server_info(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} cannot get_server_info: it is scripted")
