"""/dashboard in headless Chromium: behind the API key like every route, its charts move when
requests arrive, and the requests it lists carry the engine's own counts and, for a traced
request, its tokens with their logprobs."""

from __future__ import annotations

import re

import httpx
import pytest
from browser import browser_page
from conftest import LiveServer, wait_for

KEY = "dashboard-key"


@pytest.fixture(scope="module")
def keyed_server(engine):
    server = LiveServer(engine, api_key=KEY)
    yield server
    server.stop()


def test_dashboard_needs_the_key(keyed_server):
    for path in ("/dashboard", "/dashboard/data"):
        assert httpx.get(keyed_server.url + path).status_code == 401
        assert httpx.get(f"{keyed_server.url}{path}?key=wrong").status_code == 401
        assert httpx.get(f"{keyed_server.url}{path}?key={KEY}").status_code == 200
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(keyed_server.url + "/dashboard/data", headers=headers).status_code == 200
    # The query key opens the dashboard only.
    assert httpx.get(f"{keyed_server.url}/server_info?key={KEY}").status_code == 401


def _decode_points(page) -> list[float]:
    """The decode tokens/s line's plotted heights (0 at the bottom, 90 at the top)."""
    points = page.locator("#chart-1 polyline").first.get_attribute("points") or ""
    return [90 - float(p.split(",")[1]) for p in points.split()]


def test_charts_and_requests_update(keyed_server, engine):
    headers = {"Authorization": f"Bearer {KEY}"}
    with browser_page(1300, 1000) as page:
        page.goto(f"{keyed_server.url}/dashboard?key={KEY}")
        wait_for(lambda: page.locator("#chart-1").get_attribute("data-samples"), 30, "a sample")
        assert page.locator("#requests tr").count() == 0
        assert not any(h > 0 for h in _decode_points(page))

        replies = [
            httpx.post(
                keyed_server.url + "/generate",
                headers=headers,
                json={
                    "text": f"Request {i}:",
                    "sampling_params": {
                        "max_new_tokens": 8,
                        "temperature": 0,
                        "ignore_eos": True,
                        "trace": i == 0,
                    },
                    "return_logprob": True,
                },
                timeout=60,
            ).json()
            for i in range(3)
        ]
        # The page polls on its own: the requests appear, newest first, and the decode line
        # rises off zero.
        wait_for(lambda: page.locator("#requests tr").count() == 3, 30, "the listed requests")
        wait_for(lambda: any(h > 0 for h in _decode_points(page)), 30, "decode tokens/s")
        rows = page.locator("#requests tr")
        for row, reply in zip(rows.all(), reversed(replies), strict=True):
            counts = f"{reply['meta_info']['prompt_tokens']} "
            assert row.locator("td").nth(2).text_content().startswith(counts)
            assert row.locator("td").nth(2).text_content().endswith("→ 8")
        ttft = page.locator('#chart-3 [data-field="ttft_p50_ms"] b').text_content()
        assert float(ttft) > 0

        # Only the traced request lists its tokens; hovering one shows the logprob the
        # request itself was given.
        traced = rows.nth(2).locator(".tok")
        assert traced.count() == 8 and rows.nth(0).locator(".tok").count() == 0
        logprobs = [lp for lp, _, _ in replies[0]["meta_info"]["output_token_logprobs"]]
        traced.nth(3).hover()
        assert f"logprob {logprobs[3]:.4f}" in page.locator("#tip").text_content()
    page_text = httpx.get(f"{keyed_server.url}/dashboard?key={KEY}").text
    assert not re.search(r"\b(src|href)\s*=|<link|@import", page_text)  # nothing else fetched
