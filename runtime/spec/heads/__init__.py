"""Trained draft heads for speculative decoding, over the target's own hidden states:
Medusa heads and the EAGLE-3 draft layer, loaded from the layouts SGLang and vLLM read."""

from braid.runtime.spec.heads.load import load_head_proposer
from braid.runtime.spec.heads.proposer import HeadProposer

__all__ = ["HeadProposer", "load_head_proposer"]
