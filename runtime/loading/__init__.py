"""From a model's files to a runnable model: finding the directory, configs, weights (HF,
GGUF), quantization and dtype chosen for the machine, the runner set up.
"""
