"""Without Chromium the browser tests skip, unless SLUICE_REQUIRE_BROWSER=1 makes it a failure."""

import importlib

import pytest

browser_conftest = importlib.import_module("tests.browser.conftest")


def test_missing_chromium_skips(monkeypatch, tmp_path):
    monkeypatch.setattr(browser_conftest, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.delenv("SLUICE_REQUIRE_BROWSER", raising=False)

    with pytest.raises(pytest.skip.Exception, match="not found"):
        browser_conftest._require_chromium()


def test_missing_chromium_fails_when_required(monkeypatch, tmp_path):
    monkeypatch.setattr(browser_conftest, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("SLUICE_REQUIRE_BROWSER", "1")

    with pytest.raises(pytest.fail.Exception, match="SLUICE_REQUIRE_BROWSER=1"):
        browser_conftest._require_chromium()
