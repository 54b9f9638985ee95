"""The model and its KV pool, set up on the engine thread: weights loaded (or sharded over
tensor-parallel ranks), the pool sized from what is left, CUDA graphs captured, all behind
one ModelRunner."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from braid.runtime.config import EngineConfig
from braid.runtime.engine.heap import release_free_heap
from braid.runtime.executor.cuda_graphs import DecodeGraphs
from braid.runtime.executor.model_runner import ModelRunner
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.dtype import resolve_dtype
from braid.runtime.loading.model_loader import load_model
from braid.runtime.models.config.model_config import ModelConfig
from braid.runtime.tp import RankReport, start_ranks

log = logging.getLogger(__name__)


def set_up_model(
    path: Path, mc: ModelConfig, config: EngineConfig, tokenizer_size: int
) -> tuple[ModelRunner, torch.dtype, list[RankReport]]:
    """The runner over the model at `path`, the activation dtype `auto` resolved to, and
    what each tensor-parallel rank holds (rank 0 alone without tp)."""
    c = config
    dtype, why = resolve_dtype(c, mc)
    log.info("dtype %s (%s)", str(dtype).removeprefix("torch."), why)
    ranks = None
    if c.tp > 1:  # rank 0's shard and pool; the other ranks hold theirs
        model, kv, ranks = start_ranks(path, mc, dtype, c)
        reports = ranks.reports
    else:
        model = load_model(
            path, mc, dtype, c.torch_device, c.cpu_kernels, c.deterministic, c.quantization
        )
        per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, dtype)
        kv = KVPool(
            mc.num_layers, c.kv_pool_tokens(per_token), mc.num_kv_heads, mc.head_dim, dtype,
            c.torch_device,
        )  # fmt: skip
        reports = [RankReport.of(0, model, kv)]
    try:
        release_free_heap()  # what loading freed (converted blocks' temporaries)
        log.info("model ops: %s", model.ops.name)
        log.info(
            "KV pool: %d tokens (%s GB%s, %s, %s)",
            kv.num_slots,
            " + ".join(f"{r.kv_bytes / 1024**3:.2f}" for r in reports),
            f" on {c.tp} ranks" if c.tp > 1 else "",
            dtype,
            c.torch_device,
        )
        graphs = _capture_graphs(model, kv, c, mc.max_position_embeddings)
    except BaseException:
        if ranks is not None:
            ranks.close()
        raise
    return ModelRunner(model, kv, c.torch_device, tokenizer_size, graphs, ranks), dtype, reports


def _capture_graphs(model, kv: KVPool, c: EngineConfig, context_length: int):
    """Decode CUDA graphs on a CUDA device (None elsewhere, or when turned off). With tp > 1
    every rank would have to capture its graphs and replay them in step with rank 0's; not
    done: tensor-parallel steps run eagerly."""
    max_graph_batch = min(c.cuda_graph_max_batch, c.max_running_requests)
    if c.torch_device.type != "cuda" or max_graph_batch <= 0 or c.tp > 1:
        return None
    try:
        graphs = DecodeGraphs(model, kv, max_graph_batch, context_length)
    except RuntimeError as e:
        raise RuntimeError(
            f"capturing the decode CUDA graphs failed ({e}); "
            "EngineConfig(cuda_graph_max_batch=0) runs without them"
        ) from e
    log.info("CUDA graphs: decode batches of %s", graphs.sizes)
    return graphs
