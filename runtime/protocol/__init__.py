"""The types the frontend, the engine and the server all speak, importing neither torch nor
transformers: sampling parameters, outputs, and the wire fields both sides of HTTP share.
"""
