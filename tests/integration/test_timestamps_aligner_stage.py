"""The gateway's timestamps against the REAL aligner stage (aligner_service's servicer and model
on the parity fixture checkpoint, tests/fixtures/aligner/ckpt) behind fake talker and decoder
stages: the two sides of the internal Aligner contract agree. The fixture's weights are random,
so its times say nothing about the fake audio; what must hold is the contract: one timed unit per
word of each segment's text, spans that are those words in the request's text, in order, and
times that are monotonic and inside each segment's audio as sent, after resampling."""

from __future__ import annotations

import re
from pathlib import Path

from aligner_service.config import AlignerConfig
from aligner_service.model import AlignInput, load_aligner
from aligner_service.server import AlignerServicer
from tests.helpers.fake_stages import Harness, run
from tests.unit.aligner.test_server import started, stopped
from tts_common.pb.qwen3tts.v1 import tts_pb2

CHECKPOINT = Path(__file__).resolve().parents[1] / "fixtures" / "aligner" / "ckpt"
TEXT = "First, the quick brown fox jumps over the lazy dog. Then it's home again, slowly! See you."


def test_the_real_aligner_stage_times_every_word_of_every_segment() -> None:
    async def main() -> list[tts_pb2.SynthesizeResponse]:
        servicer = AlignerServicer(
            str(CHECKPOINT), AlignerConfig(max_batch_size=4), load_model=load_aligner, make_input=AlignInput
        )
        server, target = await started(servicer)
        try:
            async with Harness(frames=8, segment_tokens=16, aligner_targets=(target,)) as h:
                request = tts_pb2.SynthesizeRequest(
                    text=TEXT,
                    speaker="vivian",
                    language="english",
                    timestamps=tts_pb2.TIMESTAMP_UNIT_WORD,
                    output=tts_pb2.AudioFormat(sample_rate=16000),
                )
                return [r async for r in h.stub.Synthesize(request, timeout=60)]
        finally:
            await stopped(server, servicer)

    responses = run(main(), timeout=120)
    summary = responses[-1].summary
    assert summary.num_segments > 1
    timings = {r.timestamps.index: r.timestamps for r in responses if r.HasField("timestamps")}
    assert sorted(timings) == [s.index for s in summary.segments]
    previous_end = 0
    for segment in summary.segments:
        message = timings[segment.index]
        assert not message.error, message.error
        text = TEXT[segment.text_start : segment.text_end]
        words = [m.group() for m in re.finditer(r"[A-Za-z']+", text)]
        assert [u.text for u in message.units] == words
        for unit in message.units:
            assert TEXT[unit.char_start : unit.char_end] == unit.text
            assert segment.text_start <= unit.char_start < unit.char_end <= segment.text_end
            assert previous_end <= unit.start_sample <= unit.end_sample
            assert segment.start_sample <= unit.start_sample
            assert unit.end_sample <= segment.start_sample + segment.num_samples
            previous_end = unit.end_sample
