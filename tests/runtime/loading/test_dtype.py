"""`dtype="auto"`: the faster of float32 and bfloat16 on the machine, measured."""

from __future__ import annotations

import pytest
import torch

from braid.runtime.config import EngineConfig
from braid.runtime.loading import dtype as dtype_choice
from braid.runtime.models.config.model_config import ModelConfig


def model_config(tiny_model_path) -> ModelConfig:
    from braid.runtime.loading.model_loader import load_model_config

    return load_model_config(tiny_model_path)


@pytest.mark.parametrize("faster", [torch.float32, torch.bfloat16])
def test_auto_picks_whichever_dtype_times_faster(tiny_model_path, monkeypatch, faster):
    monkeypatch.setattr(dtype_choice, "cpu_has_bf16_matmuls", lambda: True)
    timed = []

    def timer(dtype: torch.dtype, in_features: int, out_features: int) -> float:
        timed.append((dtype, in_features, out_features))
        return 1.0 if dtype == faster else 3.0

    mc = model_config(tiny_model_path)
    chosen, why = dtype_choice.resolve_dtype(
        EngineConfig(device="cpu", quantization="none"), mc, timer
    )
    assert chosen == faster
    assert {d for d, _, _ in timed} == {torch.float32, torch.bfloat16}
    assert {(i, o) for _, i, o in timed} == {(mc.hidden_size, mc.intermediate_size)}
    assert "float32 1000.00 ms" in why or "float32 3000.00 ms" in why


def test_auto_is_float32_without_bf16_matmuls_and_explicit_dtypes_are_kept(
    tiny_model_path, monkeypatch
):
    monkeypatch.setattr(dtype_choice, "cpu_has_bf16_matmuls", lambda: False)
    mc = model_config(tiny_model_path)

    def never(*args) -> float:
        raise AssertionError("nothing to time")

    assert (
        dtype_choice.resolve_dtype(EngineConfig(device="cpu", quantization="none"), mc, never)[0]
        == torch.float32
    )
    explicit = EngineConfig(device="cpu", dtype="bfloat16", quantization="none")
    assert dtype_choice.resolve_dtype(explicit, mc, never) == (torch.bfloat16, "asked for")


def test_auto_is_float32_for_quantized_linears_whatever_the_timings(tiny_model_path, monkeypatch):
    """The quantized kernels take float32 activations: bfloat16 would only add conversions
    (and keep the decode stack of quant_decoder.py from serving)."""
    monkeypatch.setattr(dtype_choice, "cpu_has_bf16_matmuls", lambda: True)
    mc = model_config(tiny_model_path)
    bf16_faster = lambda dtype, *shape: 1.0 if dtype == torch.bfloat16 else 3.0  # noqa: E731
    for quantization in ("gguf", "int8", "int4"):
        config = EngineConfig(device="cpu", quantization=quantization)
        chosen, why = dtype_choice.resolve_dtype(config, mc, bf16_faster)
        assert chosen == torch.float32 and "quantized" in why
    assert dtype_choice.resolve_dtype(
        EngineConfig(device="cpu", quantization="none"), mc, bf16_faster
    )[0] == (torch.bfloat16)


def test_the_engine_runs_in_the_resolved_dtype(tiny_model_path, tmp_path, monkeypatch):
    from braid.runtime import Engine

    monkeypatch.setenv("BRAID_CACHE", str(tmp_path))
    engine = Engine(model=str(tiny_model_path), device="cpu", max_kv_tokens=256)
    try:
        expected, _ = dtype_choice.resolve_dtype(engine.config, engine.model_config)
        assert engine.dtype == expected == engine.kv.dtype
        assert next(engine.model.parameters()).dtype == expected
    finally:
        engine.shutdown()
    if dtype_choice.cpu_has_bf16_matmuls():  # the real measure was cached for this CPU
        assert (tmp_path / "dtype.json").is_file()
