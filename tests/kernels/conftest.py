"""Kernel tests run the Triton kernels on CUDA when there is a GPU, else in triton's
interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET before triton is imported)."""

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE
