"""The playground's word highlighting in headless Chromium (Debian's ``chromium``), over fake
stages and a fake aligner: with "Highlight each word" on, Speak reads the SSE stream, shows the
text under the wave and highlights each word while it plays, in order, every one of them, each
at the time the aligner put it (checked against the page's own audio clock); the same in
type-as-you-speak mode over the WebSocket. A screenshot is saved (``$QWEN3TTS_SCREENSHOT_DIR``,
else the test's tmp_path).

Skipped, with the reason, where Chromium is not installed (`apt-get install chromium`).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tests.helpers.browser import Browser, chromium, chromium_path
from tests.helpers.fake_aligner import harness_with_aligner
from tests.helpers.fake_stages import SAMPLES_PER_FRAME, run

CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium not installed (Debian package `chromium`): no browser test"
)

FRAMES = 30  # 2.4 s of audio: time enough to see each word highlighted
TEXT = "One two three four five six."
WATCH = """(() => {
  // Every change of the word playing, with the audio-as-sent time it changed at.
  playground.seen = [];
  setInterval(() => {
    const last = playground.seen[playground.seen.length - 1];
    if (!last || last.word !== playground.currentWord) {
      const now = document.querySelector('#captions .word.now');
      playground.seen.push({ word: playground.currentWord, t: playingSeconds(), text: now ? now.textContent : null });
    }
  }, 15);
})()"""


def _speak_with_words(browser: Browser, url: str, screenshot: Path, live: bool) -> dict[str, object]:
    browser.open(url + "/")
    browser.wait_for("!document.getElementById('words').disabled", 20, "the highlight switch (aligner found)")
    browser.click("#words")
    browser.evaluate(f"document.getElementById('text').value = {TEXT!r}".replace("'", '"'))
    browser.evaluate(WATCH)
    if live:
        browser.click("#live")
        browser.click("#speak")
        browser.wait_for("playground.live === 'open'", 20, "the WebSocket to open")
        time.sleep(0.2)
        browser.click("#end")
    else:
        browser.click("#speak")
    browser.wait_for("playground.words.length === 6", 30, "the words")
    browser.wait_for("document.querySelector('#captions .word.now') !== null", 30, "a highlighted word")
    browser.screenshot(screenshot)
    browser.wait_for("document.body.dataset.state === 'done'", 30, "the end of the stream")
    browser.wait_for(
        "playground.samplesPlayed > 0 && playground.samplesPlayed === playground.samplesReceived",
        30,
        "the page to play every sample it received",
    )
    browser.wait_for("!playground.highlighting", 10, "the highlighting to stop")
    return browser.evaluate(
        "({seen: playground.seen, words: playground.words, captions: document.getElementById('captions').textContent,"
        " heard: document.querySelectorAll('#captions .word.heard').length, lastBody: playground.lastBody})"
    )


@pytest.mark.parametrize("live", [False, True], ids=["speak", "type-as-you-speak"])
def test_each_word_is_highlighted_while_it_plays(tmp_path: Path, live: bool) -> None:
    assert CHROMIUM is not None
    screenshot = Path(os.environ.get("QWEN3TTS_SCREENSHOT_DIR") or tmp_path) / f"playground-words-{live}.png"
    screenshot.parent.mkdir(parents=True, exist_ok=True)

    async def main() -> dict[str, object]:
        async with harness_with_aligner(frames=FRAMES, delay=0.005, http=True) as h:
            with chromium(CHROMIUM) as browser:
                return await asyncio.to_thread(_speak_with_words, browser, h.http_url, screenshot, live)

    page = run(main(), timeout=120)
    words = page["words"]
    assert isinstance(words, list)
    assert [w["text"] for w in words] == ["One", "two", "three", "four", "five", "six"]
    assert page["captions"] == TEXT and page["heard"] == 6
    if not live:  # a download asks for audio again, not for events
        assert page["lastBody"]["response_format"] == "pcm" and "stream_format" not in page["lastBody"]  # type: ignore[index,operator]
    seconds = FRAMES * SAMPLES_PER_FRAME / 24000
    assert abs(words[-1]["end"] - seconds) < 1e-6
    seen = [s for s in page["seen"] if s["word"] >= 0]  # type: ignore[union-attr]
    # Every word was highlighted, in order, each while the audio clock was inside its time.
    assert [s["word"] for s in seen] == list(range(6)), seen
    for s in seen:
        word = words[s["word"]]
        assert s["text"] == word["text"]
        assert word["start"] - 0.05 <= s["t"] < word["end"] + 0.05, (s, word)
    assert screenshot.read_bytes().startswith(b"\x89PNG")
