"""Prefix affinity: which engine a prompt goes to, so that prompts sharing a prefix share
an engine's prefix cache, while no engine queues far more than the others.

An approximate map of what each engine holds: a prompt's first characters are cut into
blocks whose hashes chain (a block's hash covers all the text before it), and each hash maps
to the engines that were sent a prompt starting that way. A prompt goes to the least loaded
engine holding its longest known prefix, unless that engine has more than `balance_slack`
requests in flight beyond the least loaded engine: then to the least loaded one, which then
holds the prefix too. So a hot prefix (one few-shot prompt for a whole eval) spreads over
the engines and is computed once on each, instead of queueing on one. SGLang's router does
the same with a radix tree of characters per worker; blocks of hashes keep this one small.
Used where braid routes by itself: a RayBackend's actors, and the requests a `braid serve
--dp` front sends to replicas without the SGLang router.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class AffinityConfig:
    # A match is counted in whole blocks: ~16 tokens of English text.
    block_chars: int = 64
    # Prompts are compared over their first block_chars * max_blocks characters (4,096):
    # few-shot prompts and system prompts differ from each other well before that.
    max_blocks: int = 64
    # Requests in flight an engine may have beyond the least loaded one before a prompt that
    # matches it goes elsewhere: small enough to keep every engine busy, large enough that a
    # prefix is not copied to every engine as soon as two requests for it arrive.
    balance_slack: int = 4
    # Block hashes remembered (least recently used forgotten first): bounds the memory.
    max_entries: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("block_chars", "max_blocks", "max_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"AffinityConfig.{name} must be >= 1")
        if self.balance_slack < 0:
            raise ValueError("AffinityConfig.balance_slack must be >= 0")


class PrefixAffinity:
    """Picks an engine per prompt (`acquire`) and counts its requests in flight until
    `release`. Safe from many threads."""

    def __init__(self, num_engines: int, config: AffinityConfig | None = None) -> None:
        if num_engines < 1:
            raise ValueError("PrefixAffinity needs at least one engine")
        self.config = config or AffinityConfig()
        self.loads = [0] * num_engines  # requests in flight per engine
        self.num_blocks = [0] * num_engines  # block hashes each engine holds
        self._holders: OrderedDict[int, int] = OrderedDict()  # block hash -> engine bitmask
        self._lock = threading.Lock()

    def acquire(self, prompt: str, healthy: list[bool] | None = None) -> int:
        """The engine for `prompt`, among the `healthy` ones (all by default), counted as
        one more request in flight there."""
        n = len(self.loads)
        usable = [i for i in range(n) if healthy is None or healthy[i]]
        if not usable:
            raise RuntimeError("no healthy engine to send the request to")
        hashes = self._hashes(prompt)
        with self._lock:
            holders = 0
            for h in reversed(hashes):  # the longest known prefix first
                holders = self._holders.get(h, 0) & _mask(usable)
                if holders:
                    break
            # Least loaded; among equals the one holding the fewest prefixes, so new prefixes
            # spread over the engines.
            least = min(usable, key=lambda i: (self.loads[i], self.num_blocks[i], i))
            choice = least
            if holders:
                best = min((i for i in usable if holders >> i & 1), key=self.loads.__getitem__)
                if self.loads[best] <= self.loads[least] + self.config.balance_slack:
                    choice = best
            self._remember(hashes, choice)
            self.loads[choice] += 1
            return choice

    def release(self, engine: int) -> None:
        """The request sent to `engine` by `acquire` has finished."""
        with self._lock:
            self.loads[engine] -= 1

    def _hashes(self, prompt: str) -> list[int]:
        """Chained hashes of the prompt's blocks (the last one may be partial)."""
        size = self.config.block_chars
        text = prompt[: size * self.config.max_blocks]
        hashes, h = [], 0
        for start in range(0, len(text), size):
            h = hash((h, text[start : start + size]))
            hashes.append(h)
        return hashes

    def _remember(self, hashes: list[int], engine: int) -> None:
        bit = 1 << engine
        for h in hashes:
            held = self._holders.get(h, 0)
            if not held & bit:
                self.num_blocks[engine] += 1
            self._holders[h] = held | bit
            self._holders.move_to_end(h)
        while len(self._holders) > self.config.max_entries:
            _, held = self._holders.popitem(last=False)
            for i in range(len(self.num_blocks)):
                if held >> i & 1:
                    self.num_blocks[i] -= 1


def _mask(engines: list[int]) -> int:
    out = 0
    for i in engines:
        out |= 1 << i
    return out
