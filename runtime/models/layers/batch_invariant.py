"""BatchInvariantLinear: a linear whose output rows do not depend on the rows batched with
them (deterministic mode).

MKL picks its float32 matmul kernel by the number of rows, so a row's output changed in the
last bits with the batch it came in, enough to flip a greedy token now and then. Fed in tiles
of a fixed number of rows, the last one padded, every row goes through the same kernel
whatever the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

TILE = 16  # rows per matmul: a decode step of a few requests pays for no more than this


class BatchInvariantLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        padded = -rows % TILE
        if padded:
            x = torch.cat([x, x.new_zeros(padded, *x.shape[1:])])
        tiles = [F.linear(t, self.weight, self.bias) for t in x.split(TILE)]
        return torch.cat(tiles)[:rows]
