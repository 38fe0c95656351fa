"""The real-time listener (tts_common.playback) the benches count underruns with and the decoder
paces its chunks by."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tts_common.playback import Playback


def test_a_late_chunk_is_one_gap_waited_out() -> None:
    player = Playback()
    assert player.left_s(5.0) is None
    assert player.chunk(10.0, 0.16) == 0.0  # plays until 10.16
    assert player.left_s(10.1) == pytest.approx(0.06)
    assert player.chunk(10.5, 0.08) == pytest.approx(340.0)  # resumes at 10.5, plays until 10.58
    assert player.left_s(10.5) == pytest.approx(0.08)
    assert player.chunk(10.55, 0.08) == 0.0  # in time: the earlier gap is not carried over
    assert player.underruns == 1 and player.underrun_ms == pytest.approx(340.0)


@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)), min_size=1, max_size=40))
def test_the_audio_heard_plus_the_waits_is_the_time_it_took(arrivals: list[tuple[float, float]]) -> None:
    """Chunks (gap before it, seconds of audio): each is late by exactly how far the audio before
    it fell short, and once the last has played, playing and waiting add up to the elapsed time."""
    player, now = Playback(), 0.0
    for gap, seconds in arrivals:
        now += gap
        before = player.left_s(now)
        late = player.chunk(now, seconds)
        assert late == (0.0 if before is None else pytest.approx(max(-before, 0.0) * 1000))
        assert player.left_s(now) == pytest.approx(max(before or 0.0, 0.0) + seconds)
    end = now + player.left_s(now)
    assert end - player.first_at == pytest.approx(player.played_s + player.stalled_s)
