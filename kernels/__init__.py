"""Triton kernels and their plain-PyTorch reference twins."""

from kernels.reference import sample

__all__ = ["sample"]
