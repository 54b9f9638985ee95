"""EngineCore: everything the engine thread runs, built in one place on that thread."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from braid.runtime.config import HEAD_METHODS, EngineConfig
from braid.runtime.executor.model_runner import ModelRunner
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.kvcache.radix_cache import RadixCache
from braid.runtime.loading.model_setup import set_up_model
from braid.runtime.lora.registry import AdapterRegistry
from braid.runtime.models.config.model_config import ModelConfig
from braid.runtime.output.processor import OutputProcessor
from braid.runtime.scheduler.scheduler import Scheduler
from braid.runtime.spec import SpecWorker, load_draft_proposer
from braid.runtime.spec.heads import load_head_proposer
from braid.runtime.spec.lossless import unlike_decode_rows
from braid.runtime.stats import EngineStats
from braid.runtime.tp import RankReport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineCore:
    runner: ModelRunner
    dtype: torch.dtype  # the activations' (EngineConfig.dtype resolved)
    tp_ranks: list[RankReport]  # what every tensor-parallel rank holds (rank 0 alone without tp)
    kv: KVPool
    cache: RadixCache
    scheduler: Scheduler
    outputs: OutputProcessor
    worker: ModelRunner | SpecWorker  # what runs a batch: the runner, or speculation around it
    adapters: AdapterRegistry
    speculation: str  # what spec_method runs as, and why when auto left it off


def build_core(
    path: Path,
    model_config: ModelConfig,
    config: EngineConfig,
    tokenizer: PreTrainedTokenizerBase,
    stats: EngineStats,
) -> EngineCore:
    """Load the model at `path` and build what runs it (on the engine thread: an OpenMP team
    left by another thread makes libgomp stop spinning between parallel regions, which made
    large decode steps markedly slower)."""
    c = config
    runner, dtype, tp_ranks = set_up_model(path, model_config, c, len(tokenizer))
    try:
        kv = runner.kv
        cache = RadixCache(kv, enabled=c.prefix_cache)
        draft = None
        if c.spec_method == "draft":
            draft = load_draft_proposer(c, runner.model, tokenizer, runner.vocab_size, kv.num_slots)
        elif c.spec_method in HEAD_METHODS:
            draft = load_head_proposer(c, runner, kv.num_slots)
        scheduler = Scheduler(c, kv, cache, stats, draft.kv if draft is not None else None)
        worker, speculation = runner, f"speculation {c.spec_method}"
        if c.spec_method == "auto" and (why := unlike_decode_rows(runner.model)) is not None:
            speculation = f"speculation off (auto: {why})"
            log.info("%s", speculation)
        elif c.spec_method != "none":
            worker = SpecWorker(c, runner, stats, scheduler, draft)
        adapters = AdapterRegistry(c, model_config, dtype, lambda: scheduler.live.values())
        for entry in c.lora:
            adapters.register(*entry.split("=", 1))
    except BaseException:
        if runner.ranks is not None:
            runner.ranks.close()
        raise
    outputs = OutputProcessor(stats)
    return EngineCore(
        runner, dtype, tp_ranks, kv, cache, scheduler, outputs, worker, adapters, speculation
    )
