"""The Engine: its public API (engine.py) and the engine thread's loop."""
