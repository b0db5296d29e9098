"""Headless Chromium for the browser test and the documentation screenshots.

Debian's ``chromium`` and ``chromium-driver`` packages (``bin/browser-deps`` installs
them); Selenium is pointed at them explicitly so it never downloads a browser.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path(os.environ.get("CHROMIUM_BINARY", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CHROMEDRIVER_BINARY", "/usr/bin/chromedriver"))

CHROMIUM_ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def missing() -> list[str]:
    """What is not installed, as paths; empty when the browser can start."""
    return [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]


@contextmanager
def chromium(width: int = 1400, height: int = 900) -> Iterator[object]:
    """A fresh headless Chromium (its own profile directory), quit afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_AVOID_STATS", "true")
    profile = tempfile.mkdtemp(prefix="nw-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in CHROMIUM_ARGS:
        options.add_argument(argument)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
