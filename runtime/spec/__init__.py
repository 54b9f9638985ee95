"""Speculative decoding: draft proposers (n-gram lookup, a draft model, a self-draft), the
draft tree verified in one target forward, the acceptance rule, adaptive draft lengths."""

from braid.runtime.spec.draft_model import DraftModelProposer, load_draft_proposer
from braid.runtime.spec.tree import DraftTree
from braid.runtime.spec.worker import SpecState, SpecWorker

__all__ = ["DraftModelProposer", "DraftTree", "SpecState", "SpecWorker", "load_draft_proposer"]
