"""The engine's side of constrained decoding: compiling a request's constraint off the
engine thread, and the one place a request's grammar matcher is advanced.
"""
