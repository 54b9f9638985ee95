"""One step's work on the model: the runner (prepare -> forward -> sample), the forward's
batch, CUDA graphs, the sampler.
"""
