"""Shared fixtures: tiny random models of each supported architecture, the default model,
and for grammar tests its tokenizer, vocabulary and helpers that feed text through masks."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

# Without a GPU the Triton kernel tests run in triton's interpreter. triton reads the flag when
# its language module is defined, and transformers imports triton (through torch._dynamo), so
# it is set here, before anything below can import it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist the workers split the cores between them, engines and the servers they
# start included: two OpenMP teams spinning on the same cores wait on each other's barriers
# for whole time slices (a decode step 50x slower).
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)

import pytest  # noqa: E402
import transformers  # noqa: E402

from braid import grammars  # noqa: E402
from braid.grammars.matcher import allowed_token_ids  # noqa: E402

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)


def wait_idle(engine, timeout: float = 60.0) -> None:
    """Aborts are processed by the engine thread: wait until it has nothing left."""

    def idle() -> bool:
        s = engine.stats()
        return s["running_requests"] == 0 and s["waiting_requests"] == 0

    wait_for(idle, timeout, "the engine to be idle")


def wait_for(condition, timeout: float = 60.0, what: str = "the condition") -> None:
    """Poll `condition()` until it is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


async def async_wait_for(condition, timeout: float = 60.0, what: str = "the condition") -> None:
    """`wait_for` inside an event loop: polls without blocking the loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.005)


def assert_no_kv_leak(engine) -> None:
    """Every KV slot is free or owned by the radix cache."""
    s = engine.stats()
    assert s["kv_slots_free"] + s["kv_slots_cached"] == s["kv_slots_total"], s


def hold_engine(engine) -> threading.Event:
    """Block the engine thread (inside a one-token request's last emit) until the returned
    event is set: requests submitted meanwhile reach it together, in one inbox."""
    from braid.runtime import SamplingParams

    held, release = threading.Event(), threading.Event()

    def emit(chunk):
        if chunk.finish_reason is not None:
            held.set()
            release.wait(60)

    engine.submit([7], SamplingParams(max_tokens=1), emit)
    assert held.wait(60), "the engine did not run the holding request"
    return release


class StepGate:
    """Holds every step of `engine` (on the engine thread, inside the model runner's `run`)
    until the block ends or `open()`: requests reach the engine and stay in flight for as long
    as the test needs, on any machine. `waiting` is set once a step waits at the gate."""

    def __init__(self, engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waiting, self.opened = threading.Event(), threading.Event()
        run = engine.runner.run

        def gated(batch):
            self.waiting.set()
            self.opened.wait(120)
            return run(batch)

        monkeypatch.setattr(engine.runner, "run", gated)

    def open(self) -> None:
        self.opened.set()

    def __enter__(self) -> StepGate:
        return self

    def __exit__(self, *exc) -> None:
        self.open()  # a failing test leaves no step waiting


def bytes_read(pid: int) -> int:
    """What process `pid` has read so far, in bytes (Linux); 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return int(next(line for line in f if line.startswith("rchar:")).split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def compile_taken(grammars):
    """A condition for `wait_for`: true once a compile job submitted after this call is in a
    worker's hands (`grammars`: the engine's, or a GrammarCompiler). A worker waiting for its
    next job reads nothing, so one that has read since is compiling one; a worker that was not
    there is made for the job its compile thread has taken."""
    before = {pid: bytes_read(pid) for pid in grammars.worker_pids()}

    def taken() -> bool:
        pids = grammars.worker_pids()
        return any(pid not in before or bytes_read(pid) > before[pid] for pid in pids)

    return taken


@pytest.fixture
def device() -> str:
    """Where the kernel tests run the Triton kernels: CUDA when there is a GPU, else triton's
    interpreter on the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


# name -> (config class, extra config fields)
TINY_VARIANTS = {
    "llama": (transformers.LlamaConfig, dict(tie_word_embeddings=True)),
    # Biases on q, k, v and o (transformers' Llama puts attention_bias on o_proj too).
    "llama-bias": (transformers.LlamaConfig, dict(tie_word_embeddings=True, attention_bias=True)),
    "llama3-rope": (
        transformers.LlamaConfig,
        dict(
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=128,
            ),
        ),
    ),
    "mistral": (transformers.MistralConfig, dict(head_dim=16, sliding_window=None)),
    "qwen2": (transformers.Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, dict(head_dim=32, tie_word_embeddings=False)),
}


def kernels_built_with(flags: tuple[str, ...]):
    """The CPU kernels built with extra compiler flags (tests turn off what a faster path
    needs, to check the slower ones on this CPU); a skip off x86."""
    import platform

    from braid.kernels import cpu

    if flags and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the other paths are x86 ones")
    kernels = cpu.load(extra_flags=flags)
    assert kernels is not None, f"the CPU kernels must build with {flags}"
    return kernels


def random_gguf():
    """scripts/random_gguf.py, which writes random GGUF files of Llama shapes and random
    blocks of any GGUF type."""
    return _script("random_gguf")


def hf_gguf():
    """scripts/hf_gguf.py, which writes a tiny transformers model of another family as a GGUF
    laid out as llama.cpp's converter writes it."""
    return _script("hf_gguf")


def llama_cpp_refs():
    """scripts/llama_cpp_refs.py, which writes the GGUF files whose llama.cpp references
    tests/data/llama_cpp/ holds."""
    return _script("llama_cpp_refs")


def _script(name: str):
    # scripts/ is not a package: its files import each other by name, as when run from there.
    import importlib

    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    if scripts not in sys.path:
        sys.path.append(scripts)
    return importlib.import_module(name)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    from braid.runtime.loading.default_model import default_model_dir

    return default_model_dir()


@pytest.fixture(scope="session")
def long_tiny_model(tmp_path_factory, default_model_path):
    """Build (once per kind) a tiny random model with a 2,048-token context (a tools preamble
    does not fit the shared tiny model's 512) and return its path. `head_scale` multiplies
    its output head: 0.01 gives near-uniform logits (the most random text there is, so every
    valid tool call is the constraint's doing), 8 decisive greedy picks."""
    built: dict[tuple[float, bool], Path] = {}

    def make(head_scale: float, tied: bool) -> Path:
        if (head_scale, tied) not in built:
            tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_path)
            config = transformers.LlamaConfig(
                vocab_size=len(tokenizer),
                eos_token_id=tokenizer.eos_token_id,
                tie_word_embeddings=tied,
                **(TINY | {"max_position_embeddings": 2048}),
            )
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            with torch.no_grad():
                model.lm_head.weight.mul_(head_scale)
            path = tmp_path_factory.mktemp("tiny-long")
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            built[head_scale, tied] = path
        return built[head_scale, tied]

    return make


# A tool's parameters, as the tool-calling tests of every API use them.
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="session")
def make_tiny_model(tmp_path_factory, default_model_path):
    """Build (once per variant) a tiny random model saved as an HF directory with the default
    model's tokenizer, and return its path."""
    built: dict[str, Path] = {}

    def make(variant: str = "llama") -> Path:
        if variant not in built:
            config_cls, extra = TINY_VARIANTS[variant]
            tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_path)
            config = config_cls(
                vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, **TINY, **extra
            )
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            # Random init gives near-uniform logits; scale the head so greedy is decisive.
            # Biases start at zero, which would hide a bias left out: draw them.
            with torch.no_grad():
                model.lm_head.weight.mul_(8.0)
                for name, p in model.named_parameters():
                    if name.endswith(".bias"):
                        p.normal_(0.0, 0.5)
            path = tmp_path_factory.mktemp(f"tiny-{variant}")
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            built[variant] = path
        return built[variant]

    return make


@pytest.fixture(scope="session")
def tiny_model_path(make_tiny_model) -> Path:
    return make_tiny_model("llama")


@pytest.fixture
def tiny_model_copy(tiny_model_path, tmp_path) -> Path:
    """A private copy of the tiny model that a test may damage."""
    dst = tmp_path / "model"
    shutil.copytree(tiny_model_path, dst)
    return dst


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    """A tiny-model engine of the module's own: its counters and cache start clean."""
    from braid.runtime import Engine

    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    """A live server over the module's `engine`."""
    server = LiveServer(engine)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_path):
    """A tiny-model engine shared by the session's tests (counters see every module's)."""
    from braid.runtime import Engine

    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    yield engine
    engine.shutdown()


# ---- grammar tests: the default tokenizer, its vocabulary, feeding text through masks ----


@pytest.fixture(scope="session")
def tokenizer(default_model_path):
    return transformers.AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="session")
def vocab(tokenizer):
    return grammars.build_vocabulary(tokenizer, {tokenizer.eos_token_id})


@pytest.fixture(scope="session")
def feeds(tokenizer):
    """feeds(grammar, text): every token of `text` in the mask before it is accepted, then
    EOS, and the matcher terminated; False at the first refusal."""

    def feed_text(grammar, text: str) -> bool:
        matcher = grammar.matcher()
        row = grammars.allocate_bitmask(1, grammar.vocab.size)[0]
        for token in [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]:
            matcher.fill_bitmask(row)
            if token not in allowed_token_ids(row):
                return False
            assert matcher.accept_token(token), "allowed by the mask, refused by accept_token"
        return matcher.is_terminated()

    return feed_text


@pytest.fixture(scope="session")
def check_rollback(tokenizer):
    """check_rollback(grammar, text): after taking `text`'s tokens, rolling back k of them
    (and EOS) gives the masks seen before, and the tokens can be taken again."""

    def check(grammar, text: str) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        eos = tokenizer.eos_token_id
        matcher = grammar.matcher()
        rows = grammars.allocate_bitmask(len(ids) + 1, grammar.vocab.size)
        for i, token in enumerate(ids):
            matcher.fill_bitmask(rows[i])
            assert matcher.accept_token(token)
        matcher.fill_bitmask(rows[-1])
        if eos in allowed_token_ids(rows[-1]):
            assert matcher.accept_token(eos) and matcher.is_terminated()
            matcher.rollback(1)
            assert matcher.accept_token(eos)
            matcher.rollback(1)
        row = grammars.allocate_bitmask(1, grammar.vocab.size)[0]
        for back in (1, 2, len(ids)):
            matcher.rollback(back)
            matcher.fill_bitmask(row)
            assert row.equal(rows[len(ids) - back])
            for token in ids[len(ids) - back :]:
                assert matcher.accept_token(token)
        with pytest.raises(ValueError, match="roll back"):
            matcher.rollback(len(ids) + 1)

    return check


@pytest.fixture(scope="session")
def reference_logprobs(tiny_model_path):
    """reference_logprobs(ids, start): transformers' logprob of each of ids[start:] under the
    tiny model, given the tokens before it."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)

    def logprobs(ids: list[int], start: int) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].log_softmax(-1)
        return [logits[i - 1, ids[i]].item() for i in range(start, len(ids))]

    return logprobs


# ---- servers ----------------------------------------------------------------------------------


async def stream_events(
    http: httpx.AsyncClient, url: str, body: dict, on_event=None, leave_after: int = 0
) -> list[str]:
    """POST a streaming completion to `url` + /v1/completions and collect its SSE payloads
    (`on_event()` after each); with `leave_after`, disconnect once that many arrived."""
    events: list[str] = []
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                events.append(line[5:].strip())
                if on_event is not None:
                    on_event()
                if len(events) == leave_after:
                    break
    return events


class LiveServer:
    """A real braid server on loopback: uvicorn in a background thread, serving an engine the
    test also holds (so it can read the engine's counters and KV directly)."""

    def __init__(self, engine, **app_options) -> None:
        import uvicorn

        from braid.runtime.server import create_app

        app = create_app(engine, model_name="tiny", **app_options)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="test-server", daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), 30, "the server")
        assert self.server.started, "the server did not start"
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class ServeProcess:
    """`braid serve` in a process of its own on a free loopback port, as users start it."""

    def __init__(self, model: Path, *flags: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "braid.runtime.cli", "serve", "--model", str(model)]
            + ["--port", str(port), "--device", "cpu", "--dtype", "float32"]
            + ["--max-kv-tokens", "2048", "--log-level", "warning", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def healthy() -> bool:
            assert self.process.poll() is None, self.process.stdout.read()
            try:
                return httpx.get(self.url + "/health").status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_for(healthy, 120, "braid serve to start")
        except BaseException:
            self.close()
            raise

    def post(self, path: str, body: dict) -> dict:
        r = httpx.post(self.url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- peer venvs -------------------------------------------------------------------------------

PEER_VENV = Path(__file__).resolve().parents[1] / "scripts" / "peer_venv.sh"
CLIENTS_BUILD_LOG = Path(tempfile.gettempdir()) / "braid-peer-clients.log"


def pytest_configure(config) -> None:
    """When the run may reach tests/runtime/server/test_client_libraries.py and the client
    libraries' venv is not made yet, start making it (scripts/peer_venv.sh clients, ~100 s)
    in the background at once, its output in CLIENTS_BUILD_LOG: their fixture waits on its
    lock rather than building it when they start. In the controller only, not xdist workers."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    tests = Path(__file__).resolve().parent / "runtime" / "server" / "test_client_libraries.py"
    here = config.invocation_params.dir
    paths = [(here / arg.split("::")[0]).resolve() for arg in config.args]
    if not any(path == tests or path in tests.parents for path in paths):
        return
    check = subprocess.run(["bash", str(PEER_VENV), "clients", "--check"], capture_output=True)
    if check.returncode != 0:
        # bash starts the build and exits: nothing of it is left for this process to wait on.
        detach = 'bash "$0" clients >"$1" 2>&1 </dev/null &'
        subprocess.run(
            ["bash", "-c", detach, str(PEER_VENV), str(CLIENTS_BUILD_LOG)], start_new_session=True
        )


def peer_python(name: str) -> str:
    """The python of peer venv NAME (scripts/peer_venv.sh NAME: made if absent, else waited
    for while another caller makes it); a failed build fails the test with its output."""
    made = subprocess.run(["bash", str(PEER_VENV), name], capture_output=True, text=True)
    if made.returncode != 0:
        background = name == "clients" and CLIENTS_BUILD_LOG.exists()
        log = CLIENTS_BUILD_LOG.read_text()[-3000:] if background else ""
        log = log and f"the background build ({CLIENTS_BUILD_LOG}) ended:\n{log}\n"
        pytest.fail(f"{log}peer_venv.sh {name} failed ({made.returncode}):\n{made.stderr[-3000:]}")
    return made.stdout.strip().splitlines()[-1]


def made_peer_python(name: str) -> str:
    """The python of peer venv NAME where it has been made (peer_venv.sh NAME --check); a
    skip otherwise, for the slow live comparisons that never build one."""
    found = subprocess.run(["bash", str(PEER_VENV), name, "--check"], capture_output=True)
    if found.returncode:
        pytest.skip(f"no {name} venv: make it with `bash scripts/peer_venv.sh {name}`")
    return found.stdout.decode().strip()
