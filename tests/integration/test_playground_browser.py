"""The playground in headless Chromium (Debian's ``chromium``): the page loads from the gateway,
fills its voice picker from ``/v1/audio/voices``, and a real click on Speak streams PCM from
``/v1/audio/speech`` (over fake stages) and plays it with Web Audio; the samples it received are
exactly the synthesized signal, all of them are played, and time to first audio and RTF are shown.
A screenshot is saved (``$QWEN3TTS_SCREENSHOT_DIR``, else the test's tmp_path).

Skipped, with the reason, where Chromium is not installed (`apt-get install chromium`).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.browser import Browser, chromium, chromium_path
from tests.helpers.fake_stages import Harness, expected_signal, run
from tts_common.audio import float_to_pcm16

CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium not installed (Debian package `chromium`): no browser test"
)

FRAMES = 30  # 2.4 s of audio, in several chunks


def _speak(browser: Browser, url: str, screenshot: Path) -> dict[str, object]:
    """Open the page, pick a voice, click Speak, wait until everything received was played."""
    browser.open(url + "/")
    voices = browser.wait_for(
        "Array.from(document.querySelectorAll('#voice option')).map(o => o.value)", 20, "the voice picker"
    )
    assert voices == ["vivian", "ryan", "eric", "alloy"], voices
    browser.evaluate("document.getElementById('voice').value = 'alloy'")  # the alias: Ryan
    browser.click("#speak")
    browser.wait_for("document.body.dataset.state === 'done'", 30, "the page to receive the audio")
    browser.wait_for(
        "playground.samplesPlayed > 0 && playground.samplesPlayed === playground.samplesReceived",
        30,
        "the page to play every sample it received",
    )
    browser.screenshot(screenshot)
    return browser.evaluate(
        "({state: playground, shown: ['ttfa', 'rtf', 'samples-received', 'samples-played']"
        ".map(id => document.getElementById(id).textContent),"
        " pcm: playground.pcm.flatMap(chunk => Array.from(chunk)), status: document.body.dataset.state})"
    )


def test_playground_speaks_in_chromium(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    screenshot = Path(os.environ.get("QWEN3TTS_SCREENSHOT_DIR") or tmp_path) / "playground.png"
    screenshot.parent.mkdir(parents=True, exist_ok=True)

    async def main() -> dict[str, object]:
        async with Harness(frames=FRAMES, delay=0.01, http=True, voice_alias=(("alloy", "ryan"),)) as h:
            with chromium(CHROMIUM) as browser:
                # The browser is driven synchronously: off the loop that serves it.
                page = await asyncio.to_thread(_speak, browser, h.http_url, screenshot)
            assert h.talker.requests[-1].speaker == "ryan"
            assert h.active_streams == 0
            return page

    page = run(main(), timeout=120)
    state = page["state"]
    assert isinstance(state, dict)
    expected = np.frombuffer(float_to_pcm16(expected_signal(FRAMES)), dtype="<i2")
    assert state["samplesReceived"] == state["samplesPlayed"] == expected.size
    assert np.array_equal(np.asarray(page["pcm"], dtype=np.int16), expected)  # exactly the signal
    assert state["error"] is None and state["seed"]
    assert isinstance(state["ttfaMs"], (int, float)) and state["ttfaMs"] > 0
    assert isinstance(state["rtf"], (int, float)) and state["rtf"] > 0
    ttfa, rtf, received, played = page["shown"]  # type: ignore[misc]
    assert ttfa.endswith(" ms") and rtf != "–" and received == played == str(expected.size)
    assert screenshot.read_bytes().startswith(b"\x89PNG")


LIVE_TEXT = ["Hello the", "re, typed ", "while it speaks."]


def _type_as_you_speak(browser: Browser, url: str, screenshot: Path) -> dict[str, object]:
    """Type-as-you-speak mode: Start, type in pieces, End; wait until everything was played."""
    browser.open(url + "/")
    browser.wait_for("document.querySelectorAll('#voice option').length > 0", 20, "the voice picker")
    browser.click("#live")
    browser.evaluate("document.getElementById('text').value = ''")
    browser.click("#speak")
    browser.wait_for("playground.live === 'open'", 20, "the WebSocket to open")
    for piece in LIVE_TEXT:
        browser.evaluate(
            "(() => { const t = document.getElementById('text'); t.value += "
            + repr(piece).replace("'", '"')
            + "; t.dispatchEvent(new Event('input')); })()"
        )
        time.sleep(0.1)
    browser.click("#end")
    browser.wait_for("document.body.dataset.state === 'done'", 30, "the summary")
    browser.wait_for(
        "playground.samplesPlayed > 0 && playground.samplesPlayed === playground.samplesReceived",
        30,
        "the page to play every sample it received",
    )
    browser.screenshot(screenshot)
    return browser.evaluate(
        "({state: playground, pcm: playground.pcm.flatMap(chunk => Array.from(chunk)),"
        " status: document.body.dataset.state})"
    )


def test_type_as_you_speak_in_chromium(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    screenshot = Path(os.environ.get("QWEN3TTS_SCREENSHOT_DIR") or tmp_path) / "playground-live.png"
    screenshot.parent.mkdir(parents=True, exist_ok=True)

    async def main() -> tuple[dict[str, object], dict[str, str]]:
        async with Harness(frames=FRAMES, delay=0.01, http=True) as h:
            with chromium(CHROMIUM) as browser:
                page = await asyncio.to_thread(_type_as_you_speak, browser, h.http_url, screenshot)
            assert h.active_streams == 0
            return page, dict(h.talker.texts)

    page, texts = run(main(), timeout=120)
    assert list(texts.values()) == ["".join(LIVE_TEXT)]  # typed in pieces: one text_open request
    state = page["state"]
    assert isinstance(state, dict)
    expected = np.frombuffer(float_to_pcm16(expected_signal(FRAMES)), dtype="<i2")
    assert state["samplesReceived"] == state["samplesPlayed"] == expected.size
    assert np.array_equal(np.asarray(page["pcm"], dtype=np.int16), expected)
    assert state["error"] is None and state["utterances"] == 1 and state["live"] == "closed"
    assert screenshot.read_bytes().startswith(b"\x89PNG")


def test_docs_page_renders_the_operations_in_chromium() -> None:
    """``/docs`` renders offline: Swagger UI (served by the gateway itself, as an air-gapped
    operator has it; tests reach no CDN) loads ``/openapi.json`` and lists its operations."""
    assert CHROMIUM is not None

    def open_docs(browser: Browser, url: str) -> list[str]:
        browser.open(url + "/docs")
        assert browser.evaluate("document.title").endswith("Swagger UI")
        operations: list[str] = browser.wait_for(
            "(() => { const ops = Array.from(document.querySelectorAll('.opblock-summary')).map(s =>"
            " s.querySelector('.opblock-summary-method').textContent + ' ' +"
            " s.querySelector('.opblock-summary-path').textContent.replace(/\\u200b/g, ''));"
            " return ops.length ? ops : null; })()",
            20,
            "Swagger UI to list the operations",
        )
        return operations

    async def main() -> list[str]:
        async with Harness(http=True) as h:
            with chromium(CHROMIUM) as browser:
                return await asyncio.to_thread(open_docs, browser, h.http_url)

    operations = run(main(), timeout=60)
    assert {"POST /v1/audio/speech", "GET /v1/models", "GET /v1/audio/voices"} <= set(operations), operations
