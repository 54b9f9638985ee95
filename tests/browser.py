"""A headless Chromium for tests that look at pages as a person would (the trace view, the
dashboard): Debian's `chromium` package (scripts/bootstrap.sh installs it) driven through
playwright's Python client. Tests skip only where no chromium is installed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def browser_page(width: int = 1200, height: int = 900) -> Iterator:
    """A fresh page in headless Chromium; a script error on it fails the test."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/bootstrap.sh installs it)")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        # --no-sandbox: CI and these machines run as root, where Chromium's sandbox cannot start.
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page
        finally:
            browser.close()
    assert not errors, f"the page's scripts failed: {errors}"
