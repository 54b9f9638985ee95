"""braid as users install it: one `braid` package in a complete wheel, and a frontend that
runs programs on a server without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import jsonschema
import pytest
from conftest import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("lang", "interpreter", "runtime", "kernels", "grammars")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of the checkout's files as they are (built from a copy: setuptools would
    reuse a stale build/ directory in the checkout)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["--disable-pip-version-check", "-w", str(out), str(source)],
        check=True,
        timeout=300,
    )
    [path] = out.glob("braid-*.whl")
    return path


def test_the_wheel_installs_braid_alone_with_every_source(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"braid", wheel.name.split("-py")[0] + ".dist-info"}
    # The C++ sources are compiled where braid runs; the HTML templates are the trace page's
    # and the dashboard's.
    suffixes = (".py", ".cpp", ".h", ".html")
    sources = [p for d in LAYERS for p in (ROOT / d).rglob("*") if p.suffix in suffixes]
    assert any(p.suffix == ".cpp" for p in sources)  # the CPU kernels, the lazy automaton
    for source in sources:
        inside = source.relative_to(ROOT).parts
        package = "braid" if inside[0] == "lang" else f"braid/{inside[0]}"
        assert "/".join([package, *inside[1:]]) in names, source


def test_a_fresh_install_runs_a_schema_that_needs_the_lazy_automaton(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
        + ["--disable-pip-version-check", str(wheel)],
        check=True,
        timeout=300,
    )
    # braid itself comes from the wheel; its dependencies (torch, ...) from this test's own
    # environment, appended after the fresh venv's site-packages.
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[a-z]+-[0-9]+$", "maxLength": 9}},
        "required": ["code"],
        "additionalProperties": False,
    }
    script = textwrap.dedent(
        f"""
        import json, braid
        from braid import gen, program

        @program
        def code(s):
            s += "A product code: "
            s += gen("code", json_schema={schema!r}, max_tokens=24, temperature=0)

        state = code.run()
        print(json.dumps({{"file": braid.__file__, "code": state["code"]}}))
        """
    )
    run = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["file"].startswith(str(venv))  # the installed wheel, not this checkout
    jsonschema.validate(json.loads(out["code"]), schema)


# What a process importing only the frontend's side may load of the runtime: the shared
# types, the chat-template markers, and the prefix-affinity router RayBackend routes with.
_FRONTEND_ROOMS = ("braid.runtime.protocol.", "braid.runtime.text.")
_FRONTEND_MODULES = {
    "braid.runtime.protocol",
    "braid.runtime.text",
    "braid.runtime.cluster",
    "braid.runtime.cluster.affinity",
}


def _loaded_without_torch(statements: str) -> list[str]:
    """The braid modules a fresh process has loaded after `statements`, run where torch,
    transformers and the server's packages cannot be imported."""
    script = textwrap.dedent(
        """
        import json, sys
        for blocked in ("torch", "transformers", "starlette", "uvicorn", "ray"):
            sys.modules[blocked] = None  # importing any of them now fails
        """
    )
    script += textwrap.dedent(statements)
    script += "\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('braid'))))\n"
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_the_protocol_imports_nothing_of_the_engine_rooms():
    loaded = _loaded_without_torch(
        """
        import braid.runtime.protocol as protocol
        for name in protocol.__all__:
            getattr(protocol, name)
        """
    )
    runtime = [m for m in loaded if m.startswith("braid.runtime.")]
    assert "braid.runtime.protocol.sampling_params" in runtime
    assert all(m.startswith("braid.runtime.protocol") for m in runtime), runtime
    assert not [m for m in loaded if m.startswith(("braid.interpreter", "braid.kernels"))]


def test_the_remote_backends_import_without_torch():
    loaded = _loaded_without_torch(
        """
        from braid import OpenAIBackend, RayBackend, RemoteBackend, gen, program, select
        from braid.runtime import GenerateOutput, SamplingParams, StreamChunk
        """
    )
    assert "braid.interpreter.remote_backend" in loaded
    runtime = {m for m in loaded if m.startswith("braid.runtime.")} - _FRONTEND_MODULES
    beyond = [m for m in runtime if not m.startswith(_FRONTEND_ROOMS)]
    assert not beyond, beyond
    assert not [m for m in loaded if m.startswith("braid.kernels")]


def test_a_remote_program_runs_without_torch(tiny_model_path, tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        for blocked in ("torch", "transformers", "starlette", "uvicorn"):
            sys.modules[blocked] = None  # importing any of them now fails
        from braid import RemoteBackend, gen, program, select

        @program
        def qa(s):
            s += "Q: Say something.\\nA:"
            s += gen("answer", max_tokens=8, temperature=0)
            s += "\\nMood:"
            s += select("mood", ["happy", "sad"])

        state = qa.run(backend=RemoteBackend(sys.argv[1]))
        print(json.dumps({"answer": state["answer"], "mood": state["mood"]}))
        """
    )
    with ServeProcess(tiny_model_path) as server:
        run = subprocess.run(
            [sys.executable, "-c", script, server.url],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        out = json.loads(run.stdout.splitlines()[-1])
        direct = server.post(
            "/generate",
            {
                "text": "Q: Say something.\nA:",
                # A program's gens heal the prompt's last token by default.
                "sampling_params": {"max_new_tokens": 8, "temperature": 0, "token_healing": True},
            },
        )
        assert out["answer"] == direct["text"] and out["mood"] in ("happy", "sad")
