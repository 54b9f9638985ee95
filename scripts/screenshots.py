"""Make the trace pages under docs/traces/ and the screenshots docs/trace.png and
docs/dashboard.png on the default model (Debian's chromium through playwright, as the browser
tests use them).

    .venv/bin/python scripts/screenshots.py

The traces: the README's program, a fork program and a constrained program (docs/programs.md
describes them). The dashboard is a server on the same engine while a few requests run.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import httpx
import msgspec
import uvicorn
from playwright.sync_api import sync_playwright

from braid import assistant, gen, program, select, system, user
from braid.interpreter import LocalBackend
from braid.runtime import Engine
from braid.runtime.server import create_app

DOCS = Path(__file__).resolve().parents[1] / "docs"
KEY = "screenshots"


class Contact(msgspec.Struct):
    name: str
    email: str


@program
def triage(s, note: str):  # the README's program
    s += system("You read support notes.")
    s += user(f"Note: {note}\nIs it urgent?")
    s += assistant(select("urgent", ["yes", "no"]))
    s += user("Who wrote it? Answer as JSON.")
    s += assistant(gen("contact", json_schema=Contact, max_tokens=64))


@program
def ideas(s, topic: str, n: int = 3):  # a fork program (examples/quickstart.py's)
    s += user(f"Give one short idea for {topic}.")
    forks = s.fork(n)
    for i, f in enumerate(forks):
        f += assistant(gen("idea", max_tokens=24, stop="\n", temperature=0.8, seed=i))
    s += assistant("Ideas:\n" + "\n".join(f"- {f['idea']}" for f in forks))


@program
def invoice(s, text: str):  # a constrained program: regex, dtype and select
    s += user(f"Read this invoice line and give its fields.\n{text}")
    with s.assistant():
        s += "Date: " + gen("date", regex=r"\d{4}-\d{2}-\d{2}") + "\n"
        s += "Amount: " + gen("amount", dtype=float, max_tokens=8) + "\n"
        s += "Currency: " + select("currency", ["EUR", "USD", "GBP"])


def traces(backend: LocalBackend) -> Path:
    out = DOCS / "traces"
    out.mkdir(exist_ok=True)
    note = "Server down since 9am! -- Ana, ana@example.com"
    state = triage.run(note=note, backend=backend, trace=True, temperature=0)
    state.trace().to_html(out / "readme.html")
    ideas.run(topic="a rainy weekend", backend=backend, trace=True).trace().to_html(
        out / "fork.html"
    )
    line = "2026-03-14 Blue widgets x3, total 42.50 EUR"
    state = invoice.run(text=line, backend=backend, trace=True, temperature=0)
    state.trace().to_html(out / "constrained.html")
    return out


def serve(engine: Engine) -> tuple[uvicorn.Server, str]:
    app = create_app(engine, model_name="default", api_key=KEY)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.1)
    return server, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


def load(url: str, rounds: int) -> None:
    """Requests a few at a time, every other one traced, for the dashboard to show."""
    headers = {"Authorization": f"Bearer {KEY}"}
    prompts = ["Write a haiku about rain.", "List three fruits.", "Say hello in French."]

    def one(i: int) -> None:
        sampling = {"max_new_tokens": 24 + 8 * (i % 3), "temperature": 0.7, "trace": i % 2 == 0}
        body = {"text": prompts[i % 3], "sampling_params": sampling, "return_logprob": True}
        httpx.post(url + "/generate", json=body, headers=headers, timeout=120)

    for r in range(rounds):
        threads = [threading.Thread(target=one, args=(4 * r + i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.5)


def main() -> None:
    engine = Engine()
    out = traces(LocalBackend(engine))
    server, url = serve(engine)
    chromium = shutil.which("chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 820})
        page.goto((out / "constrained.html").as_uri())
        page.locator('span.tok[data-gen="amount"]').first.hover()
        page.screenshot(path=DOCS / "trace.png")
        page.goto(f"{url}/dashboard?key={KEY}")
        load(url, rounds=6)
        time.sleep(2)  # two more polls: the last requests are listed
        page.screenshot(path=DOCS / "dashboard.png", full_page=True)
        browser.close()
    server.should_exit = True
    engine.shutdown()
    print(f"wrote {out}/*.html, {DOCS / 'trace.png'}, {DOCS / 'dashboard.png'}")


if __name__ == "__main__":
    main()
