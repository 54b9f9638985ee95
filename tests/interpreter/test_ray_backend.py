"""RayBackend: run_batch over engines in Ray actors on a local Ray cluster, with the local
engine's results; a failing program fails alone, as in a local run_batch."""

from __future__ import annotations

import pytest
import ray

from braid import gen, program, select
from braid.interpreter import LocalBackend, RayBackend
from braid.runtime import Engine

# Four few-shot prompts (four eval tasks); each program asks one question after one of them.
SHOTS = [
    "".join(f"Q: What is {a} {op} {b}?\nA: {fn(a, b)}\n" for a, b in [(3, 4), (7, 2), (5, 5)] * 6)
    for op, fn in [
        ("plus", lambda a, b: a + b),
        ("times", lambda a, b: a * b),
        ("minus", lambda a, b: a - b),
        ("max of", max),
    ]
]


@program
def fewshot(s, shots: str, a: int, b: int, pattern: str = "[0-9]+"):
    s += shots + f"Q: What is {a} and {b}?\nA:"
    s += gen("answer", max_tokens=4, regex=pattern)
    s += "\nSure?" + select("sure", ["yes", "no"])


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


# Starting a Ray cluster takes most of a minute (the cluster extra, docs/scale-out.md).
@pytest.mark.slow
def test_run_batch_on_ray_actors_equals_the_local_run_batch(ray_cluster, tiny_model_path):
    batch = [{"shots": SHOTS[i % 4], "a": i, "b": 2 * i + 1} for i in range(64)]
    batch.append({"shots": SHOTS[0], "a": 1, "b": 2, "pattern": "(unclosed"})
    config = dict(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    backend = RayBackend(num_actors=2, **config)
    engine = Engine(**config)
    try:
        on_ray = fewshot.run_batch(batch, backend=backend, temperature=0)
        local = fewshot.run_batch(batch, backend=LocalBackend(engine), temperature=0)
        stats = backend.stats()
    finally:
        backend.shutdown()
        engine.shutdown()
    assert all(s.error is None for s in on_ray[:64])
    assert [(s["answer"], s["sure"]) for s in on_ray[:64]] == [
        (s["answer"], s["sure"]) for s in local[:64]
    ]
    # The bad regex fails its own program, with the local engine's error.
    assert type(on_ray[64].error) is type(local[64].error) is ValueError
    assert str(on_ray[64].error) == str(local[64].error)
    assert all(s["requests_finished"] > 0 for s in stats)  # both actors served
    # What the driver cannot answer without an engine of its own, it says so.
    assert backend.token_texts([1, 2]) == [None, None]
    assert backend.token_pieces("Q:", [1]) is None and backend.prompt_chars("Q:", 1) is None
    with pytest.raises(NotImplementedError, match="RayBackend cannot get_server_info"):
        backend.get_server_info()
