"""Request trees: a shared prefix and its branches, submitted as one unit.

The interpreter turns a program's fork/select into a tree: each node's segment extends its
parent's, and each leaf is a request with its own SamplingParams. The leaves are submitted
together; the scheduler prefills a prefix they share once and the others wait for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from braid.runtime.protocol.sampling_params import SamplingParams


@dataclass
class TreeNode:
    """One segment (text or token ids); a leaf has `params` and no children."""

    segment: str | list[int] = ""
    children: list[TreeNode] = field(default_factory=list)
    params: SamplingParams | None = None

    def __post_init__(self) -> None:
        if self.children and self.params is not None:
            raise ValueError("TreeNode: only leaves carry SamplingParams")

    def leaves(self) -> Iterator[tuple[list[str | list[int]], SamplingParams]]:
        """(segments from the root, params) for each leaf, depth first."""
        if not self.children:
            if self.params is None:
                raise ValueError("TreeNode: a leaf needs SamplingParams")
            yield [self.segment], self.params
            return
        for child in self.children:
            for segments, params in child.leaves():
                yield [self.segment, *segments], params
