"""AdapterRegistry: the LoRA adapters an engine serves, by name, and which of them hold their
tensors (memory.py).

Registered, unregistered and made ready on the engine thread; `by_name` is read by callers on
any thread to resolve a request's adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from braid.runtime.config import EngineConfig
from braid.runtime.lora.adapter import LoraAdapter, load_adapter
from braid.runtime.lora.memory import LoraMemory
from braid.runtime.models.config.model_config import ModelConfig

if TYPE_CHECKING:
    from braid.runtime.scheduler.request import Request


class AdapterRegistry:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        dtype: torch.dtype,
        live: Callable[[], Iterable[Request]],
    ) -> None:
        """`live()`: the queued and running requests (their adapters are never evicted)."""
        self._config = config
        self._model_config = model_config
        self._dtype = dtype
        self._live = live
        self.by_name: dict[str, LoraAdapter] = {}
        self.memory = LoraMemory(config.max_loaded_loras, self._load)

    def get(self, name: str | None) -> LoraAdapter | None:
        """The adapter called `name` (None for None); ValueError naming the loaded ones."""
        if name is None:
            return None
        adapter = self.by_name.get(name)
        if adapter is None:
            raise ValueError(
                f"unknown LoRA adapter {name!r}; loaded: {sorted(self.by_name) or 'none'}"
            )
        return adapter

    def register(self, name: str, path: str) -> None:
        """Load a PEFT adapter directory under `name` (ValueError if the name is taken or the
        adapter is not one this engine can serve)."""
        if name in self.by_name:
            raise ValueError(f"a LoRA adapter named {name!r} is loaded already; unload it first")
        adapter = self._load(name, path)
        self.memory.use(adapter, self._in_use)
        self.by_name[name] = adapter

    def unregister(self, name: str) -> None:
        """Forget the adapter `name`; ValueError while a queued or running request uses it.
        Its cached prefixes are never matched again and go when the cache needs room."""
        adapter = self.get(name)
        users = [r.rid for r in self._live() if r.lora is adapter]
        if users:
            raise ValueError(
                f"LoRA adapter {name!r} is in use by {len(users)} queued or running requests"
            )
        del self.by_name[name]
        self.memory.forget(adapter)

    def ready(self, adapter: LoraAdapter | None) -> str | None:
        """Why a new request cannot run under `adapter` (None if it can, once its tensors are
        in memory again: an evicted adapter is loaded here, before any step can run it)."""
        if adapter is None:
            return None
        if self.by_name.get(adapter.name) is not adapter:  # unloaded since the caller looked
            return f"LoRA adapter {adapter.name!r} was unloaded"
        try:
            self.memory.use(adapter, self._in_use)
        except ValueError as e:  # its files changed or went since it was registered
            return f"reloading LoRA adapter {adapter.name!r} failed: {e}"
        return None

    def evict_unused(self) -> None:
        """Drop the tensors of adapters over the bound that no request uses now."""
        self.memory.evict(self._in_use)

    def _in_use(self) -> set[LoraAdapter]:
        return {r.lora for r in self._live() if r.lora is not None}

    def _load(self, name: str, path: str) -> LoraAdapter:
        c = self._config
        if c.tp > 1 or c.deterministic:
            raise ValueError(
                "LoRA adapters run neither with tp > 1 nor with deterministic=True "
                "(their updates are neither sharded nor batch-invariant)"
            )
        return load_adapter(name, path, self._model_config, self._dtype, c.torch_device)
