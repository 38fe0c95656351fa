"""The playground's word highlighting in headless Chromium (Debian's ``chromium``), over fake
stages and a fake aligner: with "Highlight each word" on, Speak reads the SSE stream, shows the
text under the wave and highlights each word while it plays, in order, every one of them, each
at the time the aligner put it (checked against the page's own audio clock), or, for a word that
played before its timing came, flashes it once it has; the same in type-as-you-speak mode over
the WebSocket. What the user sees is read off the page's DOM as it changes. A screenshot is saved (``$QWEN3TTS_SCREENSHOT_DIR``,
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
from tests.helpers.fake_aligner import FakeAligner, harness_with_aligner
from tests.helpers.fake_stages import SAMPLES_PER_FRAME, run

CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium not installed (Debian package `chromium`): no browser test"
)

FRAMES = 30  # 2.4 s of audio: time enough to see each word highlighted
ALIGNER_LATE_S = 0.8
"""An aligner this slow answers after the first word (0.4 s) has played."""
TEXT = "One two three four five six."
WATCH = """(() => {
  // What the user sees: each word the page shows as playing ("now") or flashes as played before it
  // could be shown ("late"), the first time it does, with the audio-as-sent time it did at. A DOM
  // observer: no sampling interval can miss a short highlight.
  playground.shown = [];
  const done = new Set();
  new MutationObserver((records) => {
    for (const record of records) {
      const span = record.target;
      if (!span.classList.contains('word')) continue;
      for (const kind of ['now', 'late']) {
        const word = playground.words[Number(span.dataset.index)];
        if (!span.classList.contains(kind) || done.has(kind + word.char_start)) continue;
        done.add(kind + word.char_start);
        playground.shown.push({ kind, char_start: word.char_start, text: span.textContent, t: playingSeconds() });
      }
    }
  }).observe(document.getElementById('captions'), { subtree: true, attributes: true, attributeFilter: ['class'] });
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
        "({shown: playground.shown, words: playground.words, captions: document.getElementById('captions').textContent,"
        " heard: document.querySelectorAll('#captions .word.heard').length, lastBody: playground.lastBody})"
    )


@pytest.mark.parametrize(
    ("live", "aligner_delay"),
    [(False, 0.0), (True, 0.0), (True, ALIGNER_LATE_S)],
    ids=["speak", "type-as-you-speak", "late-timings"],
)
def test_each_word_is_shown_while_it_plays_or_flashed_when_late(
    tmp_path: Path, live: bool, aligner_delay: float
) -> None:
    """Every word is shown, in order: highlighted while it plays, each at the time the aligner put
    it; or, if it played before the page could highlight it (its timing came late: a slow
    aligner, a loaded machine), flashed as "late" once it has. "late-timings": an aligner slower
    than the first word, whose timing then always comes after it played."""
    assert CHROMIUM is not None
    screenshot = (
        Path(os.environ.get("QWEN3TTS_SCREENSHOT_DIR") or tmp_path)
        / f"playground-words-{live}-{aligner_delay}.png"
    )
    screenshot.parent.mkdir(parents=True, exist_ok=True)

    async def main() -> dict[str, object]:
        aligner = FakeAligner(delay=aligner_delay)
        async with harness_with_aligner(aligner, frames=FRAMES, delay=0.005, http=True) as h:
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
    index = {w["char_start"]: i for i, w in enumerate(words)}
    shown = page["shown"]
    assert isinstance(shown, list)
    now = [(index[s["char_start"]], s) for s in shown if s["kind"] == "now"]
    late = [(index[s["char_start"]], s) for s in shown if s["kind"] == "late"]
    # Every word shown exactly once, one way or the other; the highlights in order.
    assert sorted(i for i, _ in now + late) == list(range(6)), shown
    assert [i for i, _ in now] == sorted(i for i, _ in now), shown
    for i, s in now:  # highlighted while the audio clock was inside its time
        assert s["text"] == words[i]["text"]
        assert words[i]["start"] - 0.05 <= s["t"] < words[i]["end"] + 0.05, (s, words[i])
    for i, s in late:  # flashed only once it had played, and only then
        assert s["text"] == words[i]["text"]
        assert words[i]["end"] <= words[i]["lateAt"] <= s["t"] + 0.05, (s, words[i])
    if aligner_delay:  # the first word's timing came after it had played: it was flashed
        assert words[0]["arrived"] >= words[0]["end"] and 0 in {i for i, _ in late}, (shown, words)
    assert screenshot.read_bytes().startswith(b"\x89PNG")
