"""Turns per-request SamplingParams into the tensors `kernels.sample` takes, and samples."""

from __future__ import annotations

import torch
from kernels.reference import sample as reference_sample

from runtime.sampling_params import SamplingParams

_MASK63 = (1 << 63) - 1


def step_seed(request_seed: int, step: int) -> int:
    """A distinct, reproducible seed for each decoding step of a request."""
    # splitmix64's increment and multiplier spread consecutive steps over the whole range.
    x = (request_seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9) & _MASK63
    return x ^ (x >> 31)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], seeds: list[int]
) -> tuple[list[int], list[float]]:
    """Sample one token per row of logits [B, V]; returns token ids and their logprobs."""
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device)
    seed_t = torch.tensor(seeds, dtype=torch.int64, device=device)
    ids, logprobs = reference_sample(logits, None, temperature, top_k, top_p, min_p, seed_t)
    return ids.tolist(), logprobs.tolist()
