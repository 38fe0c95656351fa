"""Registered and inline cloned voices through the gateway and its voice library (SQLite here;
both back ends: ``tests/unit/gateway/voice_library``, several gateways over PostgreSQL:
``tests/integration/test_voice_library.py``): RegisterVoice / ListVoices / GetVoice / UpdateVoice
/ ExportVoice / ImportVoice / DeleteVoice, limits, the legacy voices directory, a database that
cannot answer, and what the talker, decoder and speaker stages receive."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import grpc
import numpy as np

from gateway.voice_library import ANONYMOUS, create_voice_library
from tests.helpers.fake_stages import (
    EMBEDDING_DIM,
    SAMPLES_PER_FRAME,
    Harness,
    expect_rpc_error,
    expected_signal,
    ref_codes,
    run,
)
from tests.helpers.voices import fake_embedding, write_legacy_voice
from tts_common.audio import encode_audio_file, float_to_pcm16
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc


def wav_bytes(seconds: float = 1.0, rate: int = 16000, freq: float = 220.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return encode_audio_file((0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, "wav")


def test_register_list_use_delete_voices(tmp_path: Path) -> None:
    database = tmp_path / "voices.db"

    async def main() -> None:
        async with Harness("base", frames=4, voices_db=str(database), max_voices=2) as h:
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
            assert icl.updated_at == icl.created_at and icl.owner == ""  # no API keys: anonymous
            assert (icl.model, icl.family) == (h.model_name, "0b6")
            assert [r.want_codes for r in h.speaker.requests] == [True, False]
            # limit, refused before the speaker stage is asked
            err = await expect_rpc_error(
                h.stub.RegisterVoice(
                    tts_pb2.RegisterVoiceRequest(
                        reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True)
                    )
                )
            )
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "voice limit reached (2" in err.details() and len(h.speaker.requests) == 2
            # listing
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert [v.voice_id for v in listed.voices] == [icl.voice_id, xvec.voice_id]
            assert listed.voices[0] == icl and not listed.next_page_token
            assert (listed.model_type, listed.model_size, listed.sample_rate) == ("base", "0b6", 24000)
            assert listed.voice_clone_supported and not listed.instruct_supported
            assert list(listed.languages) == ["auto", "chinese", "english"]
            # kept in the library, embedding and codes exactly
            async with create_voice_library(database) as library:
                stored = await library.get(icl.voice_id, ANONYMOUS)
            assert stored.speaker_embedding.tobytes() == fake_embedding(wav_bytes()).tobytes()
            assert stored.ref_codes is not None and stored.ref_codes.flat() == list(ref_codes().values)
            assert stored.info.audio_sha256 == hashlib.sha256(wav_bytes()).hexdigest()

            # synthesis with the in-context voice: embedding, codes and transcript reused
            embeds = len(h.speaker.requests)
            meta, chunks, summary = await h.synthesize(
                tts_pb2.SynthesizeRequest(text="Hi", voice_id=icl.voice_id)
            )
            sent = h.talker.requests[-1]
            assert (
                np.array(sent.speaker_embedding, np.float32).tobytes()
                == fake_embedding(wav_bytes()).tobytes()
            )
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
            for call in (
                h.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id=icl.voice_id)),
                h.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=icl.voice_id)),
                h.stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=icl.voice_id)),
            ):
                err = await expect_rpc_error(call)
                assert err.code() == grpc.StatusCode.NOT_FOUND, err
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert [v.voice_id for v in listed.voices] == [xvec.voice_id]

        # a restarted gateway serves the stored voice without the speaker stage
        async with Harness("base", speaker=False, voices_db=str(database)) as h2:
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


def register(stub: tts_pb2_grpc.TextToSpeechStub, name: str = "v", **fields: object) -> object:
    """A RegisterVoice call of an x-vector-only voice from a fresh recording."""
    return stub.RegisterVoice(
        tts_pb2.RegisterVoiceRequest(
            name=name,
            reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(freq=100 + len(name) * 7), x_vector_only=True),
            **fields,
        )
    )


def test_metadata_update_export_import_and_pages(tmp_path: Path) -> None:
    async def main() -> None:
        async with Harness("base", voices_db=str(tmp_path / "voices.db")) as h:
            voice = await register(
                h.stub,
                "narrator",
                description="Warm.",
                labels={"lang": "en", "tier": "gold"},
                consent="cons_1",
            )
            assert (voice.description, dict(voice.labels), voice.consent) == (
                "Warm.",
                {"lang": "en", "tier": "gold"},
                "cons_1",
            )
            assert await h.stub.GetVoice(tts_pb2.GetVoiceRequest(voice_id=f" {voice.voice_id} ")) == voice
            # rename and relabel; the embedding and the creation time stay
            time.sleep(0.002)
            renamed = await h.stub.UpdateVoice(
                tts_pb2.UpdateVoiceRequest(voice_id=voice.voice_id, name="storyteller", labels={"lang": "fr"})
            )
            assert (renamed.name, renamed.description, dict(renamed.labels)) == (
                "storyteller",
                "Warm.",
                {"lang": "fr"},
            )
            assert (
                renamed.created_at == voice.created_at
                and renamed.updated_at.ToNanoseconds() > voice.updated_at.ToNanoseconds()
            )
            cleared = await h.stub.UpdateVoice(
                tts_pb2.UpdateVoiceRequest(voice_id=voice.voice_id, description="", clear_labels=True)
            )
            assert (cleared.name, cleared.description, dict(cleared.labels)) == ("storyteller", "", {})
            for bad, message in (
                (
                    tts_pb2.UpdateVoiceRequest(voice_id=voice.voice_id, labels={"a": "b"}, clear_labels=True),
                    "not both",
                ),
                (tts_pb2.UpdateVoiceRequest(voice_id=voice.voice_id, labels={"bad key": "b"}), "label key"),
                (tts_pb2.UpdateVoiceRequest(voice_id=voice.voice_id, name="n" * 201), "name is too long"),
                (tts_pb2.UpdateVoiceRequest(), "voice_id is empty"),
            ):
                err = await expect_rpc_error(h.stub.UpdateVoice(bad))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.details(), err
            err = await expect_rpc_error(register(h.stub, "x", labels={"bad key": "v"}))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "label key" in err.details()
            assert len(h.speaker.requests) == 1  # refused before the speaker stage

            # export, delete, import: the same voice (id kept while free), exactly
            exported = await h.stub.ExportVoice(tts_pb2.ExportVoiceRequest(voice_id=voice.voice_id))
            document = json.loads(exported.document)
            assert document["format"] == "qwen3-tts-voice" and document["voice"]["name"] == "storyteller"
            await h.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice.voice_id))
            before = h.talker.requests[-1].speaker_embedding
            await h.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id=voice.voice_id))
            imported = await h.stub.ImportVoice(tts_pb2.ImportVoiceRequest(document=exported.document))
            assert imported.voice_id == voice.voice_id and imported.created_at == voice.created_at
            await h.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=voice.voice_id))
            after = h.talker.requests[-1].speaker_embedding
            assert np.array(after, np.float32).tobytes() == np.array(before, np.float32).tobytes()
            again = await h.stub.ImportVoice(tts_pb2.ImportVoiceRequest(document=exported.document))
            assert again.voice_id != voice.voice_id  # taken: a new id
            for bad in ("{not json", json.dumps({**document, "format_version": 9}), "[]"):
                err = await expect_rpc_error(h.stub.ImportVoice(tts_pb2.ImportVoiceRequest(document=bad)))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            err = await expect_rpc_error(
                h.stub.ExportVoice(tts_pb2.ExportVoiceRequest(voice_id="voice-" + "0" * 32))
            )
            assert err.code() == grpc.StatusCode.NOT_FOUND

            # pages
            for name in ("b", "c", "d"):
                await register(h.stub, name)
            seen, token = [], ""
            while True:
                page = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(page_size=2, page_token=token))
                assert len(page.voices) <= 2
                seen += [v.voice_id for v in page.voices]
                token = page.next_page_token
                if not token:
                    break
            everything = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert seen == [v.voice_id for v in everything.voices] and len(seen) == 5
            for bad in (
                tts_pb2.ListVoicesRequest(page_size=1001),
                tts_pb2.ListVoicesRequest(page_token="forged"),
            ):
                err = await expect_rpc_error(h.stub.ListVoices(bad))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err

    run(main())


def test_legacy_voices_directory_is_imported_once_at_start(tmp_path: Path) -> None:
    """The JSON files of a gateway before the library: imported into the default ``voices.db``
    in the same directory, their family and design kept; a voice from before model families is
    spoken by any model that can clone."""
    design = {
        "instruct": "A warm voice.",
        "text": "legacy words",
        "language": "english",
        "seed": "7",
        "model": "d",
    }
    old = write_legacy_voice(tmp_path, 1, dim=EMBEDDING_DIM)
    designed = write_legacy_voice(tmp_path, 2, dim=EMBEDDING_DIM, family="0b6", design=design)
    other = write_legacy_voice(tmp_path, 3, dim=EMBEDDING_DIM, x_vector_only=True, family="1b7")

    async def main() -> None:
        async with Harness("base", speaker=False, voices_dir=str(tmp_path)) as h:
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert [v.voice_id for v in listed.voices] == [old["voice_id"], designed["voice_id"]]
            listed_all = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(all_families=True))
            assert len(listed_all.voices) == 3
            voice = listed.voices[1]
            assert (voice.family, voice.design.instruct, voice.design.seed, voice.design.model) == (
                "0b6",
                "A warm voice.",
                7,
                "d",
            )
            assert listed.voices[0].family == "" and not listed.voices[0].HasField("design")
            await h.synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=old["voice_id"]))
            sent = h.talker.requests[-1]
            assert list(sent.speaker_embedding) == old["speaker_embedding"]
            assert (
                list(sent.ref_codes.values) == old["ref_codes"]["values"] and sent.ref_text == "legacy words"
            )
            err = await expect_rpc_error(
                h.stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi", voice_id=other["voice_id"]))
            )
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "1b7 family" in err.details()
            await h.stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id=old["voice_id"]))
        assert (tmp_path / "voices.db").is_file()
        async with Harness("base", speaker=False, voices_dir=str(tmp_path)) as h:  # imported once
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert [v.voice_id for v in listed.voices] == [designed["voice_id"]]

    run(main())


def test_per_key_quota_beside_the_global_limit() -> None:
    async def main() -> None:
        keys = {"key-a", "key-b", "key-c"}
        async with Harness("base", api_keys=frozenset(keys), max_voices_per_key=1, max_voices=2) as h:

            def as_key(key: str) -> list[tuple[str, str]]:
                return [("authorization", f"Bearer {key}")]

            first = h.stub.RegisterVoice(
                tts_pb2.RegisterVoiceRequest(
                    reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True)
                ),
                metadata=as_key("key-a"),
            )
            await first
            err = await expect_rpc_error(
                h.stub.RegisterVoice(
                    tts_pb2.RegisterVoiceRequest(
                        reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True)
                    ),
                    metadata=as_key("key-a"),
                )
            )
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "quota reached (1" in err.details()
            await h.stub.RegisterVoice(
                tts_pb2.RegisterVoiceRequest(
                    reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True)
                ),
                metadata=as_key("key-b"),
            )
            err = await expect_rpc_error(
                h.stub.RegisterVoice(
                    tts_pb2.RegisterVoiceRequest(
                        reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True)
                    ),
                    metadata=as_key("key-c"),
                )
            )
            assert (
                err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "voice limit reached (2" in err.details()
            )
            assert len(h.speaker.requests) == 2  # the refused ones never reached the speaker stage

    run(main())
