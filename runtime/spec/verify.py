"""The acceptance rule of speculative sampling, for one tree node.

The target's distribution p at a node is the one decoding would sample from there (penalties,
grammar mask, temperature, top-k/top-p/min-p all applied). Two cases:

- Point-mass drafts (n-gram continuations, greedy drafts): q = delta_x for each child x. The
  rule "accept x with probability min(1, p(x) / q(x)) = p(x), else draw from the residual
  norm(max(0, p - delta_x)) = p with x removed" is exactly "draw t ~ p; follow the child
  holding t, if any" - also with several children (the residual after rejecting x is p
  conditioned on t != x, and so on). So the engine samples at each node as decoding does, with
  the same per-step seeds: n-gram speculation reproduces non-speculative output exactly, for
  greedy and for seeded sampling alike.
- Drafts sampled from a draft model's q: `rejection_sample` below.
"""

from __future__ import annotations

import torch

from braid.kernels.reference import sampling as sampling_torch
from braid.kernels.reference.sampling import uniform_noise


def rejection_sample(p: torch.Tensor, x: int, q: torch.Tensor, accept_seed: int, seed: int) -> int:
    """The target's token at a node whose draft child x was drawn from q (p, q: probs [V]).

    Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept x with probability
    min(1, p(x) / q(x)); on rejection draw from the residual r = max(0, p - q) / Z with
    Z = sum_y max(0, p(y) - q(y)) = 1 - sum_y min(p(y), q(y)). Then for every token t
        P(t) = q(t) min(1, p(t) / q(t)) + (1 - sum_y min(p(y), q(y))) r(t)
             = min(p(t), q(t)) + max(0, p(t) - q(t)) = p(t),
    the target's distribution, whatever q is. Both draws use counter-based noise from the
    request's seeds, so a seeded request is reproducible.
    """
    u = float(uniform_noise(torch.tensor([accept_seed]), 1)[0, 0])
    if u * float(q[x]) < float(p[x]):  # u < p(x) / q(x), without dividing by q(x)
        return x
    residual = (p - q).clamp(min=0)
    if float(residual.sum()) <= 0:  # p == q up to rounding: rejection had probability ~0
        residual = p
    return race(residual, seed)


def race(probs: torch.Tensor, seed: int) -> int:
    """A draw from unnormalised probs [V], with the sampling kernel's race and noise."""
    return int(sampling_torch.race(probs.log()[None], torch.tensor([seed]))[0])
