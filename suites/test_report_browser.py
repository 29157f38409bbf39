"""The report in a real browser: headless Chromium opens it from disk with networking off.

It must load with no console error and no network request, and the matrix must really be
visible (laid out, not hidden, on top, in the viewport, verdict colours on screen). Two
planted pages prove the checks can fail. Skipped only where Chromium is not installed
(set LOCKSTEP_REQUIRE_BROWSER=1, as CI does, to make that a failure).
"""
from __future__ import annotations

import io
import os

import pytest

from reports import render_report
from reports.browser import Chromium, find_chromium
from suites.test_report import planted_records

PASS_BG = (0xE3, 0xF4, 0xE8)
FAIL_BG = (0xFB, 0xE2, 0xE2)


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        message = ("Chromium is not installed here (apt-get install -y chromium); the "
                   "browser check of the report did not run")
        if os.environ.get("LOCKSTEP_REQUIRE_BROWSER"):
            pytest.fail(message + " and LOCKSTEP_REQUIRE_BROWSER is set", pytrace=False)
        pytest.skip(message)
    with Chromium(width=1280, height=900) as chromium:
        yield chromium


@pytest.fixture(scope="module")
def report_html() -> str:
    return render_report(planted_records(), baseline=planted_records()[:4])


def _colours_in(png: bytes, box: tuple[int, int, int, int]) -> set[tuple[int, int, int]]:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    return {rgb for _, rgb in image.crop(box).getcolors(maxcolors=1 << 20)}


def test_report_opens_offline_without_errors_and_the_matrix_is_visible(browser, report_html,
                                                                        tmp_path):
    path = tmp_path / "report.html"
    path.write_text(report_html, encoding="utf-8")
    page = browser.check(path, "matrix")
    assert page.console_errors == []
    assert page.requests == [path.resolve().as_uri()]  # the file itself, nothing else
    assert page.visible, page.visibility
    shot = tmp_path / "report.png"
    shot.write_bytes(page.screenshot_png)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    v = page.visibility
    assert v["scrollWidth"] <= 1280, "the page scrolls sideways; wide tables must scroll alone"
    box = (int(v["left"]), int(v["top"]), int(v["left"] + v["width"]),
           int(v["top"] + v["height"]))
    colours = _colours_in(page.screenshot_png, box)
    assert PASS_BG in colours and FAIL_BG in colours, "verdict colours not drawn in the matrix"


def test_the_browser_checks_can_fail(browser, report_html, tmp_path):
    hidden = tmp_path / "hidden.html"
    hidden.write_text(report_html.replace("</style>", "#matrix { visibility: hidden; }</style>"),
                      encoding="utf-8")
    assert not browser.check(hidden, "matrix").visible
    covered = tmp_path / "covered.html"
    covered.write_text(report_html.replace(
        "</body>", '<div style="position:fixed;inset:0;background:#fff"></div></body>'),
        encoding="utf-8")
    assert not browser.check(covered, "matrix").visible
    noisy = tmp_path / "noisy.html"
    noisy.write_text("<!DOCTYPE html><title>t</title><div id=matrix>m</div>"
                     '<img src="http://192.0.2.1/pixel.png"><script>console.error("planted")'
                     "</script>", encoding="utf-8")
    page = browser.check(noisy, "matrix")
    assert page.visible
    assert page.external_requests == ["http://192.0.2.1/pixel.png"]
    assert any("planted" in e for e in page.console_errors)
    assert any("pixel.png" in e for e in page.console_errors)


def test_the_first_screen_shows_judged_and_failed_then_the_matrix(browser, tmp_path):
    """As the report opens (1280x900, no scrolling), a demo-sized one: seven engines that did
    not run on seven packages, with long reasons that name the package, must leave the
    headline and the top of the matrix on screen (one line per engine)."""
    from harness.manifest import LeftOutCells
    from suites.test_report import make_record, planted_manifest

    reason = ("builds its model from the package's source checkpoint; {p} has no "
              "checkpoint.json (a fixture built from a seed has no transformers counterpart)")
    manifest = planted_manifest()
    manifest.left_out = [LeftOutCells(engine=f"left-out-{e}", package=f"fixture_{p}",
                                      mode="greedy", reason=reason.format(p=p), cells=3,
                                      decided_by="declaration")
                         for e in range(4) for p in range(7)]
    unavailable = [make_record(engine=f"unavailable-{e}", package=f"fixture_{p}",
                               status="unavailable", reason=reason.format(p=p), verdicts={})
                   for e in range(3) for p in range(7)]
    path = tmp_path / "report.html"
    path.write_text(render_report(planted_records() + unavailable, manifests=[manifest]),
                    encoding="utf-8")
    for element in ("headline", "matrix"):
        page = browser.check(path, element, scroll=False)
        assert page.visible, (element, page.visibility)
    # and the check can fail: a page whose header grew below the fold
    tall = tmp_path / "tall.html"
    tall.write_text(path.read_text().replace('<ul class="not-run"',
                                             '<ul class="not-run" style="height:2000px"'),
                    encoding="utf-8")
    assert not browser.check(tall, "matrix", scroll=False).visible
