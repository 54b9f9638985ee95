"""Model configs: config.json read into one ModelConfig, per-family differences, MoE counts."""
