"""The head proposer for EngineConfig.draft_model, checked against the target it drafts for,
and the hidden states it needs asked of the target's forward."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from braid.runtime.executor.forward_batch import HiddenCapture
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models.llama import LlamaForCausalLM, Rotary
from braid.runtime.spec.heads.eagle3 import load_eagle3
from braid.runtime.spec.heads.eagle3_proposer import Eagle3Proposer
from braid.runtime.spec.heads.medusa import load_medusa
from braid.runtime.spec.heads.medusa_proposer import MedusaProposer
from braid.runtime.spec.heads.proposer import HeadProposer

if TYPE_CHECKING:
    from braid.runtime.config import EngineConfig
    from braid.runtime.executor.model_runner import ModelRunner


def load_head_proposer(config: EngineConfig, runner: ModelRunner, num_slots: int) -> HeadProposer:
    """spec_method medusa or eagle3, from the head directory config.draft_model; a head with
    its own KV (EAGLE-3) gets a pool of `num_slots` slots."""
    model = runner.model
    if type(model).forward is not LlamaForCausalLM.forward:
        raise ValueError(
            f"EngineConfig.spec_method: {config.spec_method} heads read the hidden states of "
            f"llama.py's forward; {model.config.architecture} runs its own"
        )
    path = Path(config.draft_model).expanduser()
    if not path.is_dir():
        raise ValueError(f"EngineConfig.draft_model: {path} is not a directory")
    mc, dtype = model.config, model.norm.weight.dtype
    if config.spec_method == "medusa":
        heads = load_medusa(path, mc.hidden_size, mc.vocab_size).to(runner.device, dtype)
        runner.capture = HiddenCapture(final=True)
        return MedusaProposer(heads, runner.vocab_size, config.spec_tree_width)
    if config.spec_method == "eagle3":
        head, layers = load_eagle3(path, model)
        head.to(runner.device, dtype)
        head.rotary = Rotary(head.config).to(runner.device)  # its tables stay float32
        hc = head.config
        kv = KVPool(1, num_slots, hc.num_kv_heads, hc.head_dim, dtype, runner.device)
        runner.capture = HiddenCapture(layers=layers)
        return Eagle3Proposer(head, kv, model.ops, runner.vocab_size, runner.device)
    raise ValueError(f"EngineConfig.spec_method: no head loads for {config.spec_method!r}")
