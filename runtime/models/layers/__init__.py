"""The layers the model forwards share: norms and activations per device, RoPE scalings,
quantized linears, the quantized decoder, batch-invariant ops.
"""
