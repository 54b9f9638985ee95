"""Rotary position embeddings: a config's rope parameters and the inverse frequencies they give.

Our own, so reading a model's config needs neither transformers' config classes nor its rope
module (importing them costs most of a start). The formulas are the published ones; the tests
hold them to transformers' `ROPE_INIT_FUNCTIONS`.
"""

from __future__ import annotations

import math

import torch

# Rope types whose frequencies do not depend on the sequence length, so one table serves all.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_parameters(config: dict) -> dict:
    """One dict of rope settings from a config.json of any transformers version: v5's
    `rope_parameters`, or v4's `rope_scaling` beside a top-level `rope_theta`."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if "partial_rotary_factor" in config:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    if params["rope_type"] in ("llama3", "yarn"):
        params.setdefault("original_max_position_embeddings", config["max_position_embeddings"])
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            f"unsupported partial_rotary_factor {params['partial_rotary_factor']} (braid "
            "rotates whole heads)"
        )
    if params["rope_type"] not in STATIC_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope_type {params['rope_type']!r}; "
            f"braid supports {', '.join(STATIC_ROPE_TYPES)}"
        )
    return params


def inv_freq(params: dict, head_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim / 2] (float32) and the scale of the cos/sin tables
    (yarn scales attention through them)."""
    theta = params["rope_theta"]
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    base = 1.0 / theta**exponents
    kind = params["rope_type"]
    if kind == "default":
        return base, 1.0
    if kind == "linear":
        return base / params["factor"], 1.0
    if kind == "llama3":
        return _llama3(base, params), 1.0
    return _yarn(params, head_dim, max_positions)


def _llama3(base: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a linear blend between."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    context = params["original_max_position_embeddings"]
    wavelength = 2 * math.pi / base
    blend = ((context / wavelength - low) / (high - low)).clamp(0, 1)
    return base / factor * (1 - blend) + base * blend


def _yarn(params: dict, head_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN: dimensions that turn fewer than `beta_slow` times over the original context are
    interpolated, those that turn more than `beta_fast` times kept, a ramp between; attention
    is scaled by 0.1 ln(factor) + 1 (or its mscale ratio)."""
    theta = params["rope_theta"]
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_positions / original
    positions = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)

    def dim_of(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(params.get("beta_fast") or 32), dim_of(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = ((torch.arange(head_dim // 2).float() - low) / ((high - low) or 0.001)).clamp(0, 1)
    keep = 1 - ramp  # share of each dimension's original (extrapolated) frequency
    freqs = (1 / (factor * positions)) * (1 - keep) + (1 / positions) * keep

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    scale = params.get("attention_factor")
    if scale is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        scale = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return freqs, float(scale)
