"""Speculative decoding: draft proposers (n-gram lookup, a draft model, a self-draft), the
draft tree verified in one target forward, the acceptance rule, adaptive draft lengths."""

from braid.runtime.spec.draft_model import DraftModelProposer, load_draft_proposer
from braid.runtime.spec.speculator import SpecState, Speculator
from braid.runtime.spec.tree import DraftTree

__all__ = ["DraftModelProposer", "DraftTree", "SpecState", "Speculator", "load_draft_proposer"]
