"""A real headless Chromium driven by selenium (Debian's `chromium` and `chromium-driver`; .ci/run installs them),
for the tests that open a page as a person would."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


def _driver_path() -> str | None:
    return shutil.which("chromedriver") or next((p for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
                                                 if Path(p).is_file()), None)


@contextmanager
def headless_chromium(width: int = 1280, height: int = 900) -> Iterator[object]:
    """A selenium Chrome driver on Debian's Chromium; the test is skipped, saying why, when it is not installed."""
    driver_path = _driver_path()
    if not Path(CHROMIUM).is_file() or driver_path is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; "
                    ".ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()
