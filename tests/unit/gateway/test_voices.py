"""Registered and inline cloned voices through the gateway: RegisterVoice / ListVoices /
DeleteVoice, persistence, limits, and what the talker, decoder and speaker stages receive."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import numpy as np

from gateway.voices import FileVoiceStore
from tests.helpers.fake_stages import (
    EMBEDDING_DIM,
    SAMPLES_PER_FRAME,
    Harness,
    expect_rpc_error,
    expected_signal,
    ref_codes,
    run,
)
from tts_common.audio import encode_audio_file, float_to_pcm16
from tts_common.pb.qwen3tts.v1 import tts_pb2


def wav_bytes(seconds: float = 1.0, rate: int = 16000, freq: float = 220.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return encode_audio_file((0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, "wav")


def test_register_list_use_delete_voices(tmp_path: Path) -> None:
    async def main() -> None:
        async with Harness("base", frames=4, voices_dir=str(tmp_path), max_voices=2) as h:
            icl = await h.stub.RegisterVoice(
                tts_pb2.RegisterVoiceRequest(
                    name="alice",
                    reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), ref_text="Reference words."),
                )
            )
            xvec = await h.stub.RegisterVoice(
                tts_pb2.RegisterVoiceRequest(
                    name="bob",
                    reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(freq=330), x_vector_only=True),
                )
            )
            assert icl.voice_id.startswith("voice-") and icl.voice_id != xvec.voice_id
            assert (icl.name, icl.x_vector_only, icl.ref_text) == ("alice", False, "Reference words.")
            assert (xvec.x_vector_only, xvec.ref_text) == (True, "")
            assert icl.ref_audio_seconds == 1.0 and icl.created_at.seconds > 0
            assert [r.want_codes for r in h.speaker.requests] == [True, False]
            # limit
            err = await expect_rpc_error(
                h.stub.RegisterVoice(
                    tts_pb2.RegisterVoiceRequest(
                        reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True)
                    )
                )
            )
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "voice limit reached (2" in err.details()
            # listing
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert [v.voice_id for v in listed.voices] == [icl.voice_id, xvec.voice_id]
            assert listed.voices[0] == icl
            assert (listed.model_type, listed.model_size, listed.sample_rate) == ("base", "0b6", 24000)
            assert listed.voice_clone_supported and not listed.instruct_supported
            assert list(listed.languages) == ["auto", "chinese", "english"]
            # persisted, and loadable by a fresh store
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
                [f"{icl.voice_id}.json", f"{xvec.voice_id}.json"]
            )
            reloaded = FileVoiceStore(tmp_path)
            assert await reloaded.load() == 2
            stored = await reloaded.get(icl.voice_id)
            assert stored.voice == icl and stored.ref_codes == ref_codes()
            assert stored.speaker_embedding == (await h.gateway.store.get(icl.voice_id)).speaker_embedding
            assert json.loads((tmp_path / f"{xvec.voice_id}.json").read_text())["ref_codes"] is None

            # synthesis with the in-context voice: embedding, codes and transcript reused
            embeds = len(h.speaker.requests)
            meta, chunks, summary = await h.synthesize(
                tts_pb2.SynthesizeRequest(text="Hi", voice_id=icl.voice_id)
            )
            sent = h.talker.requests[-1]
            assert len(sent.speaker_embedding) == EMBEDDING_DIM
            assert sent.ref_codes == ref_codes() and sent.ref_text == "Reference words."
            assert sent.text_feeding == tts_pb2.TEXT_FEEDING_STREAMING == meta.text_feeding
            assert h.decoder.starts[-1].prefix_codes == ref_codes()
            assert b"".join(c.data for c in chunks) == float_to_pcm16(expected_signal(4))
            assert summary.num_samples == 4 * SAMPLES_PER_FRAME
            # x-vector only voice: no codes, no transcript, no decoder prefix
            await h.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=xvec.voice_id))
            sent = h.talker.requests[-1]
            assert len(sent.speaker_embedding) == EMBEDDING_DIM
            assert sent.ref_codes.num_frames == 0 and sent.ref_text == ""
            assert h.decoder.starts[-1].prefix_codes.num_frames == 0
            assert len(h.speaker.requests) == embeds  # the speaker stage was not asked again

            # delete
            await h.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id=icl.voice_id))
            assert not (tmp_path / f"{icl.voice_id}.json").exists()
            err = await expect_rpc_error(
                h.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id=icl.voice_id))
            )
            assert err.code() == grpc.StatusCode.NOT_FOUND
            err = await expect_rpc_error(
                h.stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=icl.voice_id))
            )
            assert err.code() == grpc.StatusCode.NOT_FOUND
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert [v.voice_id for v in listed.voices] == [xvec.voice_id]

        # a restarted gateway serves the persisted voice without the speaker stage
        async with Harness("base", speaker=False, voices_dir=str(tmp_path)) as h2:
            listed = await h2.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert [v.voice_id for v in listed.voices] == [xvec.voice_id]
            await h2.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=xvec.voice_id))

    run(main())


def test_inline_clone_calls_speaker_and_passes_reference_codes() -> None:
    async def main() -> None:
        async with Harness("base", frames=3) as h:
            audio = wav_bytes()
            meta, _, _ = await h.synthesize(
                tts_pb2.SynthesizeRequest(
                    text="Hi",
                    language="English",
                    clone=tts_pb2.VoiceClone(ref_audio=audio, ref_text="Reference words."),
                )
            )
            embed = h.speaker.requests[-1]
            assert embed.audio == audio and embed.want_codes
            assert embed.encoding == tts_pb2.REFERENCE_AUDIO_ENCODING_UNSPECIFIED
            sent = h.talker.requests[-1]
            assert sent.ref_codes == ref_codes() and sent.ref_text == "Reference words."
            assert len(sent.speaker_embedding) == EMBEDDING_DIM
            assert meta.text_feeding == tts_pb2.TEXT_FEEDING_STREAMING
            assert h.decoder.starts[-1].prefix_codes == ref_codes()

            raw = np.zeros(8000, dtype="<i2")
            raw[::7] = 1000
            meta, _, _ = await h.synthesize(
                tts_pb2.SynthesizeRequest(
                    text="Hi",
                    text_feeding=tts_pb2.TEXT_FEEDING_NON_STREAMING,
                    clone=tts_pb2.VoiceClone(
                        ref_audio=raw.tobytes(),
                        x_vector_only=True,
                        ref_audio_sample_rate=16000,
                        ref_audio_encoding=tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_PCM16,
                    ),
                )
            )
            embed = h.speaker.requests[-1]
            assert not embed.want_codes and embed.sample_rate == 16000
            assert embed.encoding == tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_PCM16
            sent = h.talker.requests[-1]
            assert sent.ref_codes.num_frames == 0 and not sent.ref_text
            assert meta.text_feeding == tts_pb2.TEXT_FEEDING_NON_STREAMING
            assert h.decoder.starts[-1].prefix_codes.num_frames == 0

    run(main())


def test_register_voice_validation_and_model_info() -> None:
    async def main() -> None:
        async with Harness("custom_voice") as h:
            err = await expect_rpc_error(
                h.stub.RegisterVoice(
                    tts_pb2.RegisterVoiceRequest(
                        reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), ref_text="Words.")
                    )
                )
            )
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "needs a base model" in err.details()
            info = await h.stub.GetModelInfo(tts_pb2.GetModelInfoRequest())
            assert info.model_type == "custom_voice" and not info.voice_clone_supported
            assert [s.name for s in info.speakers] == ["vivian", "ryan", "eric"]
            assert info.max_new_tokens_limit == 4096  # the talker's max_seq_len
            assert info.default_sampling.max_new_tokens == 2048
            assert not info.default_sampling.HasField("seed")
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert [s.dialect for s in listed.speakers] == ["", "", "sichuan_dialect"]
            assert not listed.voices
        async with Harness("base") as h:
            for req, message in (
                (tts_pb2.RegisterVoiceRequest(), "reference (reference audio"),
                (
                    tts_pb2.RegisterVoiceRequest(reference=tts_pb2.VoiceClone(ref_audio=wav_bytes())),
                    "reference.ref_text",
                ),
                (
                    tts_pb2.RegisterVoiceRequest(
                        reference=tts_pb2.VoiceClone(ref_audio=b"junk", x_vector_only=True)
                    ),
                    "reference.ref_audio: could not",
                ),
                (
                    tts_pb2.RegisterVoiceRequest(
                        name="n" * 201,
                        reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True),
                    ),
                    "name is too long",
                ),
            ):
                err = await expect_rpc_error(h.stub.RegisterVoice(req))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
                assert message in err.details(), err.details()
            err = await expect_rpc_error(h.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest()))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert not h.speaker.requests

    run(main())


def test_voice_store_skips_bad_files(tmp_path: Path) -> None:
    (tmp_path / "voice-0123.json").write_text("{not json")
    (tmp_path / "other.txt").write_text("ignored")
    store = FileVoiceStore(tmp_path)
    assert asyncio.run(store.load()) == 0 and len(store) == 0


def test_voice_registered_by_another_replica_is_found_in_shared_directory(tmp_path):
    from gateway.voices import StoredVoice, new_voice_id
    from tts_common.pb.qwen3tts.v1 import tts_pb2

    writer, reader = FileVoiceStore(tmp_path), FileVoiceStore(tmp_path)
    asyncio.run(reader.load())
    voice = StoredVoice(
        voice=tts_pb2.Voice(voice_id=new_voice_id(), name="v", x_vector_only=True),
        speaker_embedding=[0.5, -1.0],
        ref_codes=None,
    )
    asyncio.run(writer.add(voice))
    assert asyncio.run(reader.get(voice.voice_id)).speaker_embedding == [0.5, -1.0]
