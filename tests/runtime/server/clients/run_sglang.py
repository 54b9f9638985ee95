"""SGLang's own frontend (sglang.RuntimeEndpoint) running a program with gen, select and a
regex gen against `braid serve` (argv[1]); the test runs the same program on braid."""

from __future__ import annotations

import importlib.util
import os
import sys
import types

# sglang 0.5.23's __init__ imports sglang.srt.utils (torch, triton, PIL...) only to patch
# transformers, which it skips when transformers is absent: the package is put in place
# without running its __init__, so that the frontend imports as it does beside another
# runtime (installed --no-deps).
root = importlib.util.find_spec("sglang").submodule_search_locations[0]
utils = types.ModuleType("sglang.srt.utils")
utils.__path__ = [os.path.join(root, "srt", "utils")]
sys.modules["sglang.srt.utils"] = utils

import sglang as sgl  # noqa: E402
from _record import emit  # noqa: E402

CHOICES = ["red", "green", "blue"]
YEAR = r"(19|20)\d\d"


@sgl.function
def program(s, question):
    s += "Question: " + question + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=8, temperature=0, stop="\n")
    s += "\nColour: " + sgl.select("colour", choices=CHOICES)
    s += "\nYear: " + sgl.gen("year", max_tokens=8, temperature=0, regex=YEAR)


sgl.set_default_backend(sgl.RuntimeEndpoint(sys.argv[1]))
state = program.run(question="What colour is the sky?")
emit(
    {
        "version": sgl.__version__,
        "answer": state["answer"],
        "colour": state["colour"],
        "year": state["year"],
        "text": state.text(),
    }
)
