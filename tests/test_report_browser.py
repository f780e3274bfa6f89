"""The report in a real browser: headless Chromium (Debian's /usr/bin/chromium) driven by Playwright.

Skipped, with the reason, only when chromium or the playwright package is missing:
    apt-get install -y chromium && pip install playwright      (never `playwright install`)
Set HARNESSRL_ARTIFACTS=1 to keep the episode screenshot in tests/artifacts/report-episode.png.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path

import pytest
from test_report import make_run, make_synthetic_run

from harnessrl.report import build_report, read_data_file, serve

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FIRST_PAINT_LIMIT_S = 3.0


def _skip(reason: str) -> None:
    warnings.warn(f"browser tests skipped: {reason}", pytest.PytestWarning, stacklevel=2)  # shown without -rs
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        _skip("chromium not installed: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip("playwright not installed: pip install playwright (the Python package; no `playwright install` needed)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Served:
    """A served report and a fresh page that records every request and script error."""

    def __init__(self, browser, folder: Path):
        self.server, self.url = serve(folder)
        self.base = self.url.rsplit("/", 1)[0] + "/"
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

    def close(self) -> None:
        self.page.close()
        self.server.shutdown()
        self.server.server_close()


def _screenshot_path(tmp_path: Path) -> Path:
    if os.environ.get("HARNESSRL_ARTIFACTS"):
        folder = Path(__file__).parent / "artifacts"
        folder.mkdir(exist_ok=True)
        return folder / "report-episode.png"
    return tmp_path / "report-episode.png"


def test_viewer_shows_the_steps_and_verdict_of_a_failed_episode(browser, tmp_path, tokenizer):
    from playwright.sync_api import expect

    run = make_run(tmp_path / "run", tokenizer, good=["json-tools"], bad=["react"], n_tasks=3, attempts=1)
    index = build_report([run])
    s = Served(browser, index.parent)
    try:
        page = s.page
        page.goto(s.url)
        page.wait_for_selector("#episode-list tbody tr")
        assert page.locator("#episode-list tbody tr").count() == 6
        page.select_option("select[name=outcome]", "failed")
        expect(page.locator("#episode-list tbody tr")).to_have_count(3)
        row = page.locator("#episode-list tbody tr").first
        file = row.get_attribute("data-file")
        _, ep = read_data_file(index.parent / file)
        verdict = ep["verdict"]
        assert verdict is not None and ep["harness"] == "react"
        row.click()
        page.wait_for_selector("#detail li.step")

        steps = page.locator("#detail li.step")
        assert steps.count() == len(ep["steps"]) >= 2
        # the verdict: at the top, and highlighted at its step
        top = page.locator("#detail .verdict-top")
        assert top.is_visible() and verdict["class"] in top.inner_text() and verdict["evidence"] in top.inner_text()
        marked = page.locator("#detail li.step.verdict-step")
        assert marked.count() == 1 and marked.get_attribute("id") == f"step-{verdict['step']}"
        assert verdict["class"] in marked.locator(".verdict-banner").inner_text()
        # each step: completion, parsed action, tool results with the blocked marker, interventions
        detail = page.locator("#detail").inner_text()
        assert ep["steps"][0]["completion"] in detail
        assert "parse error: no tool call found in the reply" in detail
        assert "BLOCKED: invalid_arguments" in detail
        assert "malformed_feedback" in detail and "blocked_feedback" in detail
        assert "grade" in detail.lower() and "answer" in detail
        # prompt messages render when their <details> opens
        first = steps.first.locator("details.prompt")
        first.locator("summary").click()
        expect(first.locator(".msg")).to_have_count(
            ep["steps"][0]["n_messages"]
        )  # rendered on the (async) toggle event
        first.locator("summary").click()  # closed again for the screenshot
        # deep link: the URL names the episode
        assert page.evaluate("location.hash") == "#episode/" + file[len("episodes/") : -3]

        page.set_viewport_size({"width": 1400, "height": 1200})
        page.evaluate("document.getElementById('episodes').scrollIntoView()")
        shot = _screenshot_path(tmp_path)
        page.screenshot(path=str(shot))
        print(f"\nscreenshot of the episode view: {shot}")
        assert shot.stat().st_size > 10_000
        # "at step N" jumps to the verdict's step
        page.locator("#detail .verdict-top a").click()
        page.wait_for_function(
            "(() => { const r = document.querySelector('li.verdict-step').getBoundingClientRect(); "
            "return r.top >= 0 && r.top < 200; })()"
        )

        assert not s.errors, s.errors
        assert all(u.startswith(s.base) or u.startswith("data:") for u in s.requests), (
            s.requests
        )  # nothing leaves the report
    finally:
        s.close()


def test_viewer_works_from_a_file_url(browser, tmp_path):
    index = build_report([make_synthetic_run(tmp_path / "run", 5)])
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(index.resolve().as_uri())
        page.wait_for_selector("#episode-list tbody tr")
        page.select_option("select[name=cls]", "blocked_call")
        page.locator("#episode-list tbody tr").first.click()
        page.wait_for_selector("#detail .verdict-top")
        assert "blocked_call" in page.locator("#detail .verdict-top").inner_text()
        assert "BLOCKED: sandbox" in page.locator("#detail").inner_text()
        assert not errors, errors
    finally:
        page.close()


def test_ten_thousand_episode_report_opens_fast(browser, tmp_path):
    from playwright.sync_api import expect

    run = make_synthetic_run(tmp_path / "run", 5000)  # 2 harnesses: 10,000 episodes
    index = build_report([run])
    s = Served(browser, index.parent)
    try:
        page = s.page
        t0 = time.perf_counter()
        page.goto(s.url, wait_until="commit")
        page.wait_for_selector("#episode-list tbody tr", state="visible")
        wall = time.perf_counter() - t0
        in_page = page.evaluate("performance.now()") / 1000
        print(
            f"\n10,000-episode report: episode list visible {wall:.2f} s after navigation (page clock {in_page:.2f} s)"
        )
        assert wall < FIRST_PAINT_LIMIT_S
        status = page.locator("#list-status").inner_text()
        assert "read 500 of 10000" in status, status
        # first paint loaded the page, its assets and ONE index page: no other page, no episode file
        loaded = [u[len(s.base) :] for u in s.requests]
        assert "episodes/index-000.js" in loaded
        assert not [u for u in loaded if u.startswith("episodes/") and u != "episodes/index-000.js"], loaded

        # a filter reads further pages on demand until the view is filled
        page.select_option("select[name=harness]", "beta")
        page.select_option("select[name=cls]", "content")
        expect(page.locator("#list-status")).to_contain_text("showing the first 200")
        expect(page.locator("#episode-list tbody tr")).to_have_count(200)
        assert all(t == "beta" for t in page.locator("#episode-list tbody tr td:nth-child(2)").all_inner_texts())
        page.locator("#episode-list tbody tr").first.click()
        page.wait_for_selector("#detail .verdict-top")
        assert "content" in page.locator("#detail .verdict-top").inner_text()
        assert not s.errors, s.errors
    finally:
        s.close()
        shutil.rmtree(index.parent, ignore_errors=True)
