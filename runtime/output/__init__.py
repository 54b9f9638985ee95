"""Output processing: sampled tokens -> stream chunks (detokenizing, stop strings and
regexes, grammar-forced text), and the per-request trace.
"""
