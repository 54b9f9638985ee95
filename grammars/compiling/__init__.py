"""Compiling constraints: the bounded worker processes, the job kinds, the compile cache."""
