"""SamplingParams: defined once, used by `gen`, the engine, the server and the sampler."""

from __future__ import annotations

import msgspec


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one request samples and when it stops.

    A msgspec Struct so the server decodes wire JSON straight into it and the same
    validation runs everywhere.
    """

    max_tokens: int = 128
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # 1 means off
    top_k: int = 0  # 0 means off
    min_p: float = 0.0  # 0 means off
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None  # None: a fresh seed per request

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 0, "max_tokens must be >= 0"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0 (0 turns it off)"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"SamplingParams: {message}")
        if any(s == "" for s in self.stop_strings):
            raise ValueError("SamplingParams: stop strings must not be empty")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
