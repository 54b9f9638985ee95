"""The `braid` command (main.py) and its subcommands: serve, bench, trace."""
