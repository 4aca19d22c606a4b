"""Headless Chromium for the dashboard tests (integration: a local Prometheus; lab: the lab's).

Debian's chromium through its chromedriver (never a driver download), loopback debugging port,
the browser console captured, and the helpers that tell a drawn chart from an empty one.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import pytest

from conftest import ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1366, 900)  # a laptop screen

# JS run in the page: how many opaque pixels of a chart's canvas have the series' colour.
# uPlot draws the axes and grid in grey, so only a drawn series line produces such pixels.
SERIES_PIXELS_JS = """
const box = arguments[0], rgb = arguments[1];
const canvas = box.querySelector('canvas');
if (!canvas || !canvas.width) return 0;
const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
let n = 0;
for (let i = 0; i < px.length; i += 4) {
  if (px[i + 3] > 200 && Math.abs(px[i] - rgb[0]) + Math.abs(px[i + 1] - rgb[1]) + Math.abs(px[i + 2] - rgb[2]) < 60) n++;
}
return n;
"""
FIRST_SERIES_RGB = [0x58, 0xA6, 0xFF]  # PALETTE[0] in dashboard.js

CHARTS_FIT_JS = """
return Array.from(document.querySelectorAll('.chart-box')).every(
  (box) => { const c = box.querySelector('canvas'); return c && Math.abs(c.clientWidth - box.clientWidth) < 2; });
"""

# Charts that have drawn at least two points (dashboard.js records it on each chart box).
DRAWN_CHARTS_JS = """
return Array.from(document.querySelectorAll('.chart-box'))
  .filter((box) => parseInt(box.getAttribute('data-drawn-points') || '0', 10) >= 2).length;
"""


def missing_prerequisites() -> List[str]:
    missing = ["%s" % path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium Python package in .venv")
    return missing


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25,
             diagnostics: Callable[[], str] = lambda: "") -> Any:
    """Poll probe() until it returns something truthy; fail with `what` after timeout."""
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 - probes poll things that are still starting
            last_error = err
        time.sleep(interval)
    pytest.fail("timed out after %.0f s waiting for %s (last error: %r)\n%s"
                % (timeout, what, last_error, diagnostics()))


@contextlib.contextmanager
def chromium(profile_dir: Path) -> Iterator[Any]:
    """A headless Chromium session; quits the browser and stops the driver in every path."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=%d,%d" % WINDOW,
                "--user-data-dir=%s" % (profile_dir / "chromium-profile"), "--no-first-run",
                "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--disable-extensions", "--mute-audio",
                "--force-device-scale-factor=1", "--remote-debugging-address=127.0.0.1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, port=free_port(),
                      log_output=str(profile_dir / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.set_window_size(*WINDOW)
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            service.stop()


def console_messages(driver) -> List[Dict[str, Any]]:
    return driver.get_log("browser")


def save_full_page(driver, path: Path) -> None:
    """The whole page at 1366 px wide: grow the viewport to the page, wait for the charts to
    follow (ResizeObserver), shoot, and restore the viewport."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WINDOW[0], "height": height, "deviceScaleFactor": 1, "mobile": False})
    try:
        wait_for("charts resized to the full-page viewport", lambda: driver.execute_script(CHARTS_FIT_JS),
                 timeout=10, interval=0.2)
        assert driver.save_screenshot(str(path)), path
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def artifacts_dir() -> Path:
    path = Path(os.environ.get("MLKVM_ARTIFACTS_DIR") or ROOT / ".cache" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_dashboard(url: str, profile_dir: Path, screenshot: str, expect_texts: Sequence[str],
                   timeout: float = 120.0) -> Dict[str, Any]:
    """Open the page, wait until every expected text is shown and a chart has drawn, save a
    screenshot (and a full-page one) under artifacts_dir(), and report what the page showed."""
    from selenium.webdriver.common.by import By

    with chromium(profile_dir) as driver:
        driver.get(url)

        def body():
            return driver.find_element(By.TAG_NAME, "body").text

        wait_for("%s on the page" % ", ".join(expect_texts), lambda: all(t in body() for t in expect_texts),
                 timeout=timeout, interval=1, diagnostics=lambda: body()[:3000])
        drawn = wait_for("a chart with a drawn series", lambda: driver.execute_script(DRAWN_CHARTS_JS),
                         timeout=timeout, interval=1)
        shot = artifacts_dir() / screenshot
        assert driver.save_screenshot(str(shot)), shot
        save_full_page(driver, shot.with_name(shot.stem + "-full.png"))
        return {
            "plotted_series": drawn,
            "severe_console_messages": [m for m in console_messages(driver) if m.get("level") == "SEVERE"],
            "error_banner": driver.find_element(By.ID, "error-banner").is_displayed(),
            "screenshot": str(shot),
        }
