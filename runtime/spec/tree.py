"""DraftTree: the tokens a proposer wants verified after a request's last token."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ROOT = -1  # the request's last token, whose logits predict the tree's first level


@dataclass
class DraftTree:
    """Node i holds `tokens[i]`; its parent is node `parents[i]` (an earlier node) or ROOT.
    Siblings are alternative continuations; one target forward verifies them all.

    `probs[i]`, when set, is the draft distribution [V] that node i's token was drawn from
    (a draft model sampling for a sampled request), which the rejection rule needs; None is a
    point mass (n-gram continuations, greedy drafts).
    """

    tokens: list[int]
    parents: list[int]
    probs: list[torch.Tensor | None] = field(default_factory=list)
    _children: list[dict[int, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.probs:
            self.probs = [None] * len(self.tokens)
        self._children = [{} for _ in range(len(self.tokens) + 1)]  # index 0 is ROOT
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents, strict=True)):
            if not ROOT <= parent < i:
                raise ValueError(f"draft node {i}: parent {parent} must be ROOT or earlier")
            self._children[parent + 1].setdefault(token, i)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_paths(cls, paths: list[list[int]]) -> DraftTree:
        """The trie of several candidate continuations (shared prefixes stored once)."""
        tree = cls([], [])
        for path in paths:
            node = ROOT
            for token in path:
                node = tree.add(node, token)
        return tree

    def add(self, parent: int, token: int, probs: torch.Tensor | None = None) -> int:
        """The child of `parent` holding `token`, created if needed."""
        existing = self._children[parent + 1].get(token)
        if existing is not None:
            return existing
        self.tokens.append(token)
        self.parents.append(parent)
        self.probs.append(probs)
        self._children.append({})
        self._children[parent + 1][token] = len(self.tokens) - 1
        return len(self.tokens) - 1

    def children(self, node: int) -> dict[int, int]:
        """token -> child node."""
        return self._children[node + 1]

    def follow(self, node: int, tokens: list[int]) -> list[int]:
        """The nodes spelling the longest prefix of `tokens` below `node`."""
        path = []
        for token in tokens:
            child = self._children[node + 1].get(token)
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def feed(self, known: list[int]) -> tuple[list[int], list[int], list[int]]:
        """What the target feeds to verify the tree after a request's `known` new tokens:
        (tokens, each one's parent among them (-1: the cached prefix's last token), the
        offsets whose logits verification reads: the last known token's, then each node's).
        The known tokens form a chain; the nodes hang below its last token."""
        k = len(known)
        parents = list(range(-1, k - 1)) + [k - 1 if p < 0 else k + p for p in self.parents]
        return known + self.tokens, parents, list(range(k - 1, k + len(self.tokens)))

    def num_leaves(self) -> int:
        return sum(1 for i in range(len(self.tokens)) if not self._children[i + 1])
