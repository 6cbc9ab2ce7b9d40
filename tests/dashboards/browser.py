"""Open exported dashboards in headless Chromium from disk, with the network off, and report what ran.

Debian's ``chromium`` is driven through Playwright's protocol client (no browser download): every
request that is not ``file:``/``data:``/``blob:`` is aborted and recorded, console errors and page
errors are collected, and a dialog (``alert(1)`` from an injected ``onerror``) is recorded and
dismissed. ``window.__xss`` is preset to ``false``; a hostile ``onerror`` in the data would set it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
_LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")

_INSPECT = """() => {
  const plots = Array.from(document.querySelectorAll('.js-plotly-plot')).map(div => {
    const svgs = Array.from(div.querySelectorAll('svg.main-svg'));
    const marks = div.querySelectorAll(
      'path.point, path.js-line, g.trace path, g.table text, g.annotation text, rect.bg').length;
    const box = div.getBoundingClientRect();
    return {id: div.id, svgs: svgs.length, marks: marks, width: box.width, height: box.height,
            canvases: div.querySelectorAll('canvas').length};
  });
  const svgText = Array.from(document.querySelectorAll('svg text')).map(t => t.textContent).join('\\n');
  return {
    plots: plots,
    svgText: svgText,
    xss: window.__xss,
    imgs: document.querySelectorAll('img').length,
    title: document.title,
    // plotly.js draws links in figures as SVG <a xlink:href>.
    links: Array.from(document.querySelectorAll('a')).map(
      a => a.getAttribute('href') || a.getAttributeNS('http://www.w3.org/1999/xlink', 'href')),
    bodyText: document.body.innerText,
  };
}"""


@dataclass
class PageReport:
    path: Path
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    blocked_requests: list[str] = field(default_factory=list)
    dom: dict[str, Any] = field(default_factory=dict)
    screenshot: Path | None = None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Debian Chromium driven by Playwright, offline."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, path: Path, screenshot_dir: Path) -> PageReport:
    report = PageReport(path=path)
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
    try:

        def route(route: Any) -> None:
            url = route.request.url
            if url.startswith(_LOCAL_SCHEMES):
                route.continue_()
            else:
                report.blocked_requests.append(url)
                route.abort()

        context.route("**/*", route)
        context.add_init_script("window.__xss = false;")
        page = context.new_page()
        page.on(
            "console", lambda msg: report.console_errors.append(msg.text) if msg.type == "error" else None
        )
        page.on("pageerror", lambda exc: report.page_errors.append(str(exc)))

        def on_dialog(dialog: Any) -> None:
            report.dialogs.append(f"{dialog.type}: {dialog.message}")
            dialog.dismiss()

        page.on("dialog", on_dialog)
        page.goto(path.resolve().as_uri(), wait_until="load")
        # Plotly draws synchronously after its script runs; wait until every plot div has its SVG.
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
            ".every(d => d.querySelector('svg.main-svg'))",
            timeout=20_000,
        )
        page.wait_for_timeout(200)  # a late onerror from a broken <img> would fire in this time
        report.dom = page.evaluate(_INSPECT)
        shot = screenshot_dir / f"{path.stem}.png"
        page.screenshot(path=str(shot), full_page=True)
        report.screenshot = shot
    finally:
        context.close()
    return report


_TEXT_BOXES = """() => Array.from(document.querySelectorAll('.js-plotly-plot svg text'))
  .filter(t => t.textContent.trim() && !t.closest('g.table'))
  .map(t => { const b = t.getBoundingClientRect();
              return {text: t.textContent, x: b.x, y: b.y, width: b.width, height: b.height}; })
  .filter(b => b.width > 0 && b.height > 0)"""


def text_boxes(browser: Any, path: Path, width: int, screenshot: Path | None = None) -> list[dict[str, Any]]:
    """The bounding box of every text drawn in the page's figures (titles, annotations, axis titles,
    tick labels, legend; not table cells) at a viewport ``width`` px wide, from disk, offline."""
    context = browser.new_context(offline=True, viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        page.goto(path.resolve().as_uri(), wait_until="load")
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
            ".every(d => d.querySelector('svg.main-svg'))",
            timeout=20_000,
        )
        page.wait_for_timeout(200)
        boxes: list[dict[str, Any]] = page.evaluate(_TEXT_BOXES)
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
    finally:
        context.close()
    return boxes


def overlapping(boxes: list[dict[str, Any]], slack: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of texts whose boxes intersect by more than ``slack`` px each way."""

    def meets(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return (
            a["x"] < b["x"] + b["width"] - slack
            and b["x"] < a["x"] + a["width"] - slack
            and a["y"] < b["y"] + b["height"] - slack
            and b["y"] < a["y"] + a["height"] - slack
        )

    return [(a["text"], b["text"]) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if meets(a, b)]
