"""gen(close_documents=...): a program's JSON gen at a small max_tokens comes back a valid
document (its finish reason "length" where steering changed it), and cut with the keyword
off; in-process and through a braid server alike."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import LiveServer
from shared_cases import PERSON

from braid import gen, program
from braid.interpreter import LocalBackend, RemoteBackend

BUDGET = 34  # room for the shortest PERSON document (12 tokens), not for what the model writes


@pytest.fixture(scope="module", params=["local", "remote"])
def backend(request, tiny_engine):
    if request.param == "local":
        yield LocalBackend(tiny_engine)
        return
    server = LiveServer(tiny_engine)
    yield RemoteBackend(server.url)
    server.stop()


@program
def person(s, seed, close):
    s += "Person: " + gen(
        "p",
        json_schema=PERSON,
        max_tokens=BUDGET,
        seed=seed,
        temperature=1.0,
        close_documents=close,
    )


def test_gen_documents_close_unless_turned_off(backend):
    cut = 0
    for seed in range(4):
        state = person.run(seed=seed, close=True, backend=backend)
        jsonschema.validate(json.loads(state["p"]), PERSON)
        assert state.meta("p")["finish_reason"] in ("stop", "length")
        off = person.run(seed=seed, close=False, backend=backend)
        try:
            jsonschema.validate(json.loads(off["p"]), PERSON)
        except (ValueError, jsonschema.ValidationError):
            cut += 1
            assert off.meta("p")["finish_reason"] == "length"
    assert cut, "no output was cut without close_documents: the budget cuts none"
