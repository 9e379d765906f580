"""Headless Chromium for the tests: Debian's ``chromium`` package (scripts/setup.sh
installs it), driven by Playwright for Python, which launches that binary instead of
downloading a browser of its own. A missing binary fails the test that asked for it,
with the command that installs it: these tests never skip.

``page.wait_for_function`` takes a function (``"() => ..."``), never a bare expression:
Playwright polls a bare expression through ``eval``, which the status page's
Content-Security-Policy refuses whenever the first check is false.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Error, Page, ViewportSize, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
DOCS_IMAGE = Path(__file__).resolve().parents[1] / "docs" / "img" / "status_page.png"
"""The README's screenshot of the status page (:func:`screenshot` with ``docs=True``)."""
UPDATE_DOCS = "KVSERVE_UPDATE_SCREENSHOTS"
PNG = b"\x89PNG\r\n\x1a\n"
LOAD_FAILED = "Failed to load resource:"
VIEWPORT: ViewportSize = {"width": 1400, "height": 700}


@dataclass
class Browsed:
    """A page and what went wrong in it: uncaught script errors and console errors (a
    Content-Security-Policy violation is one), less the browser's note on each answer
    with an error status (a test checks those through what the page shows)."""

    page: Page
    errors: list[str] = field(default_factory=list)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and not message.text.startswith(LOAD_FAILED):
            self.errors.append(f"console: {message.text}")

    def on_error(self, error: Error) -> None:
        self.errors.append(f"page error: {error.message}")


@contextmanager
def chromium_page() -> Iterator[Browsed]:
    """A fresh page in a headless Chromium (its own profile: empty storage), closed on
    exit; fails at once when Debian's ``chromium`` is not installed."""
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: the status page tests need Debian's chromium "
            "(apt-get install chromium; scripts/setup.sh installs it)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = browser.new_page(viewport=VIEWPORT)
            browsed = Browsed(page)
            page.on("console", browsed.on_console)
            page.on("pageerror", browsed.on_error)
            yield browsed
        finally:
            browser.close()


def sign_in(page: Page, key: str) -> None:
    """Give the status page, once it asks (``GET /v1/status`` answered 401), ``key``."""
    page.wait_for_selector("#key-form:not([hidden])")
    page.fill("#key", key)
    page.click("#key-form button")


def screenshot(page: Page, folder: Path, docs: bool = False) -> Path:
    """The whole page as ``folder/status_page.png`` (checked to be a PNG); with ``docs`` and
    ``KVSERVE_UPDATE_SCREENSHOTS=1``, copied to :data:`DOCS_IMAGE` too."""
    shot = folder / "status_page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes().startswith(PNG)
    if docs and os.environ.get(UPDATE_DOCS) == "1":
        shutil.copyfile(shot, DOCS_IMAGE)
    return shot
