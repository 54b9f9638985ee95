"""Triton kernels and their plain-PyTorch reference twins (`braid.kernels.reference`); C++
kernels for the CPU path (`braid.kernels.cpu`, built on first use with the system compiler).

The Triton modules load on first use: importing the package stays cheap where there is no GPU, and
TRITON_INTERPRET, which triton reads when a kernel is defined, can still be set before then.
"""

from braid._lazy import lazy_exports

# public name -> the module that defines it
_WHERE = {
    "decode_attention": "braid.kernels.triton.decode",
    "extend_attention": "braid.kernels.triton.extend",
    "lora_segmented": "braid.kernels.triton.lora",
    "rope_store_kv": "braid.kernels.triton.rope",
    "sample": "braid.kernels.triton.sampling",
}

__getattr__ = lazy_exports(__name__, _WHERE)
__all__ = list(_WHERE)
