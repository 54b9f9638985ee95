"""The one conversation pipeline that chat completions, Responses and Messages share:
rendering, tools, constraints, the token stream, ending repeated calls, parsing calls.
"""
