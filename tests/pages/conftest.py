"""One headless Chromium per test module, driven through chromedriver (selenium), for the two pages.

scripts/setup.sh installs Debian's chromium and chromium-driver where apt can; without them these tests skip,
saying why, unless PRETRAIN_BROWSER_TESTS=required (as .ci/run sets it): then they fail.
"""

import os
import shutil

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (bash scripts/setup.sh dev)"
    if not any(shutil.which(b) for b in BROWSERS) or not shutil.which("chromedriver"):
        return (
            "no chromium and chromedriver (bash scripts/setup.sh dev installs them: apt-get install chromium "
            "chromium-driver)"
        )
    return None


@pytest.fixture(scope="module")
def browser():
    why = _missing()
    if why:
        if os.environ.get("PRETRAIN_BROWSER_TESTS") == "required":
            pytest.fail(f"the browser tests are required here, but {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1100",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    options.binary_location = next(shutil.which(b) for b in BROWSERS if shutil.which(b))
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def wait(browser):
    """wait(script): until the JavaScript expression `script` is truthy in the page; its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    def until(script: str, timeout: float = 60):
        return WebDriverWait(browser, timeout, poll_frequency=0.05).until(
            lambda d: d.execute_script(f"return {script}")
        )

    return until
