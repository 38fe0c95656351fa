"""Sanity test of the fake stages the gateway tests run against."""

from __future__ import annotations

import grpc
import numpy as np

from tests.helpers.fake_stages import FakeDecoder, FakeTalker, expected_signal, run, start_fake
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2


def test_fake_decoder_and_talker_roundtrip() -> None:
    async def main() -> None:
        talker = FakeTalker(frames=5, delay=0)
        decoder = FakeDecoder()
        t_server, t_port = await start_fake(stages_pb2_grpc.add_TalkerServicer_to_server, talker)
        d_server, d_port = await start_fake(stages_pb2_grpc.add_DecoderServicer_to_server, decoder)
        try:
            async with (
                grpc.aio.insecure_channel(f"127.0.0.1:{t_port}") as tc,
                grpc.aio.insecure_channel(f"127.0.0.1:{d_port}") as dc,
            ):
                t_call = stages_pb2_grpc.TalkerStub(tc).Generate()
                await t_call.write(
                    stages_pb2.TalkerClientMessage(
                        request=stages_pb2.TalkerRequest(
                            text="x", sampling=tts_pb2.SamplingOptions(max_new_tokens=100)
                        )
                    )
                )
                d_call = stages_pb2_grpc.DecoderStub(dc).Decode()
                await d_call.write(stages_pb2.DecoderClientMessage(start=stages_pb2.DecodeStart()))
                async for message in t_call:
                    if message.WhichOneof("message") == "chunk":
                        await d_call.write(stages_pb2.DecoderClientMessage(chunk=message.chunk))
                await d_call.write(stages_pb2.DecoderClientMessage(end=stages_pb2.DecodeEnd()))
                audio = [
                    np.frombuffer(m.pcm.samples, "<f4")
                    async for m in d_call
                    if m.WhichOneof("message") == "pcm"
                ]
                np.testing.assert_array_equal(np.concatenate(audio), expected_signal(5))
                assert decoder.chunk_frames == [2, 3]
        finally:
            await t_server.stop(0)
            await d_server.stop(0)

    run(main())
