"""StreamingSynthesize paced by its reader (gateway/synthesis/session.py): a slow reader keeps
the stages a bounded number of utterances ahead instead of the gateway buffering the whole audio,
while a barge-in is still acknowledged at once, the stream goes on after it, and a reader that
goes away ends the call and frees the talker. Read in process, so no transport buffer hides what
the gateway itself holds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from gateway.voice_library import NO_KEYS
from tests.helpers.fake_aligner import FakeAligner, harness_with_aligner
from tests.helpers.fake_stages import SAMPLES_PER_FRAME, Harness, run
from tts_common.pb.qwen3tts.v1 import tts_pb2

Message = tts_pb2.StreamingSynthesizeRequest
FLUSH = Message(flush=tts_pb2.FlushText())
CANCEL = Message(cancel=tts_pb2.CancelUtterance())
SENTENCES = [f"Sentence number {n} is spoken here." for n in range(12)]
FRAMES = 4
"""Frames per utterance (the fake talker's): two decoder chunks of two frames each."""


def config(timings: bool = False) -> tts_pb2.SynthesizeRequest:
    return tts_pb2.SynthesizeRequest(
        request_id="paced",
        speaker="Vivian",
        language="English",
        timestamps=tts_pb2.TIMESTAMP_UNIT_WORD if timings else tts_pb2.TIMESTAMP_UNIT_UNSPECIFIED,
        output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32),
        streaming=tts_pb2.StreamingOptions(first_chunk_frames=2, max_chunk_frames=2),
    )


class Client:
    """The client's side of one in-process stream: messages written as the test goes."""

    def __init__(self) -> None:
        self.outbox: asyncio.Queue[Message | None] = asyncio.Queue()

    def write(self, *messages: Message) -> None:
        for message in messages:
            self.outbox.put_nowait(message)

    def done_writing(self) -> None:
        self.outbox.put_nowait(None)

    async def messages(self) -> AsyncIterator[Message]:
        while (message := await self.outbox.get()) is not None:
            yield message


def harness(
    timings: bool, aligner: FakeAligner | None = None
) -> contextlib.AbstractAsyncContextManager[Harness]:
    """Fake stages several times faster than the test's reader; with ``timings``, an aligner."""
    if timings:
        return harness_with_aligner(aligner, frames=FRAMES, segment_lookahead=1)
    return Harness(frames=FRAMES, segment_lookahead=1)


def start(h: Harness, client: Client, timings: bool = False) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
    return h.gateway.streamed.synthesize(
        config(timings), client.messages(), "paced", caller=NO_KEYS, received=time.monotonic()
    )


async def next_not_timings(
    responses: AsyncIterator[tts_pb2.SynthesizeResponse],
) -> tts_pb2.SynthesizeResponse:
    while (response := await asyncio.wait_for(anext(responses), 2)).HasField("timestamps"):
        pass
    return response


def every_sentence(client: Client) -> None:
    """Each sentence its own utterance (a flush after it)."""
    for sentence in SENTENCES:
        client.write(Message(text=sentence + " "), FLUSH)


async def eventually(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("timings", [False, True], ids=["plain", "timestamps"])
def test_a_slow_reader_paces_the_stages(timings: bool) -> None:
    """However fast the talker and the decoder, the gateway starts no more utterances than the
    one being read, its lookahead and the few whose audio it may hold for the reader."""

    async def main() -> None:
        async with harness(timings) as h:
            client = Client()
            every_sentence(client)
            client.done_writing()
            ahead = []
            ends = 0
            seen: list[str] = []
            async for response in start(h, client, timings):
                seen.append(str(response.WhichOneof("payload")))
                ends += response.HasField("utterance_end")
                await asyncio.sleep(0.03)  # a slow reader; the fake stages are several times faster
                ahead.append(len(h.talker.requests) - ends)
            assert seen.count("utterance_end") == len(SENTENCES) and seen[-1] == "summary"
            assert seen.count("audio") == 2 * len(SENTENCES)
            assert seen.count("timestamps") == (len(SENTENCES) if timings else 0)
        # The one being read, the next one queued whole (QUEUED_AUDIO_CHUNKS: its two chunks),
        # one generating plus the lookahead. Unpaced, the talker had run every sentence long
        # before the reader was half way.
        assert max(ahead) <= 4, ahead

    run(main(), timeout=60)


@pytest.mark.parametrize("timings", [False, True], ids=["plain", "timestamps"])
def test_a_barge_in_while_the_reader_lags_is_acknowledged_at_once(timings: bool) -> None:
    """With audio held for a slow reader (the stages paused on it), a cancel is the very next
    response (but for timings); no audio of the stopped utterances follows it, and the stream
    goes on."""

    async def main() -> None:
        async with harness(timings) as h:
            client = Client()
            every_sentence(client)
            responses = start(h, client, timings)
            got = [await anext(responses) for _ in range(4)]  # metadata and some audio
            await asyncio.sleep(0.3)  # the stages run until the gateway stops taking audio
            assert len(h.talker.requests) < len(SENTENCES)
            client.write(CANCEL)
            await asyncio.sleep(0.05)  # the reader took the cancel
            ack = await next_not_timings(responses)
            assert ack.HasField("utterance_end"), ack
            assert ack.utterance_end.finish_reason == tts_pb2.FINISH_REASON_CANCELLED
            sent = sum(r.audio.num_samples for r in got if r.HasField("audio"))
            assert ack.utterance_end.start_sample + ack.utterance_end.num_samples == sent
            # The next utterance after the barge-in streams from where the audio stopped.
            client.write(Message(text="Again."))
            client.done_writing()
            acks = [ack]
            while (r := await next_not_timings(responses)).HasField("utterance_end"):
                acks.append(r)  # every other stopped utterance, none with audio sent
            assert all(a.utterance_end.finish_reason == tts_pb2.FINISH_REASON_CANCELLED for a in acks)
            rest = [r, *[r async for r in responses]]
            audio = [x.audio for x in rest if x.HasField("audio")]
            assert audio[0].start_sample == sent
            assert sum(a.num_samples for a in audio) == FRAMES * SAMPLES_PER_FRAME
            end = [x.utterance_end for x in rest if x.HasField("utterance_end")]
            assert [e.finish_reason for e in end] == [tts_pb2.FINISH_REASON_EOS]
            if timings:  # the utterance read whole before the cancel, and the one after it
                assert sum(x.HasField("timestamps") for x in [*got, *acks, *rest]) >= 1
                assert rest[-2].HasField("timestamps") and rest[-2].timestamps.index == end[0].index
            summary = rest[-1].summary
            assert summary.num_samples == sent + FRAMES * SAMPLES_PER_FRAME
        await eventually(lambda: h.talker.active == 0)

    run(main(), timeout=60)


def test_a_reader_that_goes_away_while_the_stages_wait_ends_the_call() -> None:
    async def main() -> None:
        async with Harness(frames=FRAMES, segment_lookahead=1) as h:
            client = Client()
            every_sentence(client)
            responses = start(h, client)
            for _ in range(3):
                await anext(responses)
            await asyncio.sleep(0.2)  # the stages wait for the reader
            await asyncio.wait_for(responses.aclose(), 5)  # type: ignore[attr-defined]
            await eventually(lambda: h.talker.active == 0 and h.gateway.admission.active == 0)

    run(main(), timeout=60)


def test_a_held_alignment_never_holds_the_audio() -> None:
    """With the aligner answering nothing, every utterance's audio still reaches the slow reader
    (the stages paced by it alone); the timings follow once the aligner answers, before the
    summary."""

    async def main() -> None:
        aligner = FakeAligner()
        aligner.gate = asyncio.Event()
        async with harness(True, aligner) as h:
            client = Client()
            every_sentence(client)
            client.done_writing()
            responses = start(h, client, True)
            ends = 0
            while ends < len(SENTENCES):
                response = await asyncio.wait_for(anext(responses), 2)
                assert not response.HasField("timestamps")
                ends += response.HasField("utterance_end")
                await asyncio.sleep(0.01)
            aligner.gate.set()
            rest = [r async for r in responses]
            assert [r.WhichOneof("payload") for r in rest] == ["timestamps"] * len(SENTENCES) + ["summary"]

    run(main(), timeout=60)
