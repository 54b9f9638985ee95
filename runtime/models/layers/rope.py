"""Rotary position embeddings: a config's rope parameters and the inverse frequencies they give.

Our own, so reading a model's config needs neither transformers' config classes nor its rope
module (importing them costs most of a start). The formulas are the published ones; the tests
hold them to transformers' `ROPE_INIT_FUNCTIONS`.
"""

from __future__ import annotations

import math

import torch

# Rope types whose frequencies do not depend on the sequence length, so one table serves all
# (longrope picks its long or short factors once, for the engine's context: _longrope).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_parameters(config: dict) -> dict:
    """One dict of rope settings from a config.json of any transformers version: v5's
    `rope_parameters`, or v4's `rope_scaling` beside a top-level `rope_theta`."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if "partial_rotary_factor" in config:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        params.setdefault(
            "original_max_position_embeddings",
            config.get("original_max_position_embeddings") or config["max_position_embeddings"],
        )
    if not 0.0 < params.get("partial_rotary_factor", 1.0) <= 1.0:
        raise ValueError(f"unsupported partial_rotary_factor {params['partial_rotary_factor']}")
    if params["rope_type"] not in STATIC_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope_type {params['rope_type']!r}; "
            f"braid supports {', '.join(STATIC_ROPE_TYPES)}"
        )
    return params


def rotary_dim(params: dict, head_dim: int) -> int:
    """How many of a head's dimensions rotate (the first ones, in transformers' layout):
    head_dim, or its partial_rotary_factor share (Phi-4-mini's 0.75)."""
    return int(head_dim * params.get("partial_rotary_factor", 1.0))


def inv_freq(
    params: dict, head_dim: int, max_positions: int, context: int | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rotary_dim / 2] (float32) and the scale of the cos/sin tables
    (yarn and longrope scale attention through them). `max_positions`: the model's own
    max_position_embeddings, which sets yarn's and longrope's implicit factor; `context`:
    the longest sequence the engine runs (None: max_positions), which chooses longrope's
    factors."""
    head_dim = rotary_dim(params, head_dim)
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
    if kind == "longrope":
        return _longrope(base, params, max_positions, context or max_positions)
    return _yarn(params, head_dim, max_positions)


def _longrope(
    base: torch.Tensor, params: dict, max_positions: int, context: int
) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3/3.5/4-mini): each frequency divided by its own factor, the long ones
    when the context reaches past original_max_position_embeddings, else the short ones;
    attention scaled by sqrt(1 + ln(factor) / ln(original)), factor the model's own
    max_positions / original whatever the context (as transformers computes it).

    transformers switches per sequence (short factors while a sequence's length is at most
    the original context; its Phi-3 generate drops the cache when a sequence first passes it
    and prefills all again with the long ones); a paged KV holds rotated keys, so the choice
    here is made once, for the engine's context (EngineConfig.context_length, else the
    model's), as llama.cpp makes it for its context size and vLLM for its max_model_len: a
    sequence longer than the original context gets transformers' rotation exactly, a shorter
    one the long factors where transformers uses the short, unless the context is capped
    within the original, when every sequence gets the short ones as in transformers.
    Choosing by position instead (short keys below the original, long above) would match short
    sequences but mixes the two sets in one longer sequence, which the model was not trained
    on: that is what garbled Phi-3's output past 4096 tokens in transformers and vLLM before
    they stopped it."""
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_positions / original
    scale = params.get("attention_factor")
    if scale is None:
        scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    which = "long_factor" if context > original else "short_factor"
    factors = torch.tensor(params[which], dtype=torch.float32)
    if factors.shape != base.shape:
        raise ValueError(f"longrope {which} has {len(factors)} entries, not {len(base)}")
    return base / factors, float(scale)


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
