"""Speculative decoding: draft proposers (n-gram lookup, a draft model, a self-draft), the
draft tree verified in one target forward, the acceptance rule, adaptive draft lengths."""

from runtime.spec.draft_model import DraftModelProposer, load_draft_proposer
from runtime.spec.speculator import SpecState, Speculator
from runtime.spec.tree import DraftTree

__all__ = ["DraftModelProposer", "DraftTree", "SpecState", "Speculator", "load_draft_proposer"]
