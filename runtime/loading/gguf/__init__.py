"""GGUF files: their tensor index, their configs, their blocks kept or converted."""
