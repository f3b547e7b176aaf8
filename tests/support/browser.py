"""Debian's headless Chromium driven through chromedriver (selenium), for the dashboard test.

:func:`chrome` skips the test with a visible reason where Chromium, chromedriver or
selenium is missing (``make test-browser`` installs them where apt is available).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), ".artifacts")


def _which(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def chrome(width: int = 1440, height: int = 1100) -> Any:
    """A headless Chromium session with the browser console recorded; skips if unavailable."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    binary = _which(CHROMIUM)
    driver_path = _which(("chromedriver",))
    if binary is None or driver_path is None:
        pytest.skip("Chromium and chromedriver are not installed (Debian: apt-get install "
                    "chromium chromium-driver; `make test-browser` does it as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)


def artefact(name: str) -> str:
    """A path under .artifacts/ at the repository's root (made if missing)."""
    os.makedirs(ARTIFACTS, exist_ok=True)
    return os.path.join(ARTIFACTS, name)
