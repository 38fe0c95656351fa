"""Several models behind one gateway (fake stages: one fake talker per model, one decoder pool):
requests choose their model by name over gRPC and HTTP, unknown names are NOT_FOUND listing the
served ones, every model is listed with its capabilities, voices belong to a model family, a voice
is designed and cloned in one call, and a decoder pool with another speech tokenizer is refused."""

from __future__ import annotations

import io

import grpc
import numpy as np
import openai
import pytest
import soundfile as sf

from gateway.config import FLAGS, GatewayConfig, ModelRoute, gateway_config_from_args, parse_model_routes
from gateway.stages.models import IncompatibleModelsError, ModelRegistry
from tests.helpers.fake_stages import (
    SAMPLES_PER_FRAME,
    FakeDecoder,
    FakeTalker,
    Harness,
    expect_rpc_error,
    expected_signal,
    run,
    start_fake,
)
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2

MODELS = {"design": "voice_design", "base": "base", "custom": "custom_voice"}
FRAMES = 4


def pcm(text: str = "Hello there.", **fields: object) -> tts_pb2.SynthesizeRequest:
    return tts_pb2.SynthesizeRequest(
        text=text, output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32), **fields
    )


def wav_bytes(seconds: float = 1.0) -> bytes:
    out = io.BytesIO()
    sf.write(out, (0.3 * np.sin(np.arange(int(24000 * seconds)) / 9)).astype(np.float32), 24000, format="WAV")
    return out.getvalue()


def client(h: Harness) -> openai.AsyncOpenAI:
    sdk = openai.AsyncOpenAI(base_url=h.http_url + "/v1", api_key="unused", max_retries=0, timeout=20)
    h.cleanups.append(sdk.close)
    return sdk


def test_each_model_by_name_over_grpc_and_http_one_decoder_pool() -> None:
    async def main() -> None:
        async with Harness(models=MODELS, frames=FRAMES, http=True) as h:
            clone = tts_pb2.VoiceClone(ref_audio=wav_bytes(), x_vector_only=True)
            voices = {
                "design": {"instruct": "A calm voice."},
                "base": {"clone": clone},
                "custom": {"speaker": "ryan"},
            }
            for name, kind in MODELS.items():
                metadata, chunks, summary = await h.synthesize(pcm(model=name, **voices[name]))
                assert (metadata.model_name, metadata.model_type) == (name, kind)
                audio = np.frombuffer(b"".join(c.data for c in chunks), "<f4")
                np.testing.assert_array_equal(audio, expected_signal(FRAMES))
                assert h.talkers[name].requests[-1].text == "Hello there."
            assert [len(t.requests) for t in h.talkers.values()] == [1, 1, 1]
            assert len(h.decoder.starts) == 3  # one decoder pool for every model
            # No model: the default (the first listed).
            metadata, _, _ = await h.synthesize(pcm(instruct="A calm voice."))
            assert metadata.model_name == "design"
            sdk = client(h)
            for name, voice in (("design", "anything"), ("custom", "ryan")):
                body = await sdk.audio.speech.create(
                    model=name, input="Hi.", voice=voice, response_format="pcm"
                )
                samples = np.frombuffer(body.content, "<i2")
                assert samples.size == FRAMES * SAMPLES_PER_FRAME
                assert body.response.headers["x-model"] == name
            assert [len(t.requests) for t in h.talkers.values()] == [3, 1, 2]

    run(main())


def test_unknown_model_is_not_found_listing_the_served_ones() -> None:
    async def main() -> None:
        async with Harness(models=MODELS, frames=FRAMES, http=True, model_alias=(("tts-1", "custom"),)) as h:
            err = await expect_rpc_error(h.stub.Synthesize(pcm(model="nope", speaker="ryan")))
            assert err.code() == grpc.StatusCode.NOT_FOUND
            assert "unknown model 'nope'" in err.details() and "design, base, custom" in err.details()
            for call in (
                h.stub.GetModelInfo(tts_pb2.GetModelInfoRequest(model="nope")),
                h.stub.ListVoices(tts_pb2.ListVoicesRequest(model="nope")),
            ):
                assert (await expect_rpc_error(call)).code() == grpc.StatusCode.NOT_FOUND
            streamed = h.stub.StreamingSynthesize(
                iter([tts_pb2.StreamingSynthesizeRequest(config=pcm("", model="nope", speaker="ryan"))])
            )
            assert (await expect_rpc_error(streamed)).code() == grpc.StatusCode.NOT_FOUND
            sdk = client(h)
            with pytest.raises(
                openai.NotFoundError, match="unknown model 'nope'.*served: design, base, custom"
            ):
                await sdk.audio.speech.create(model="nope", input="Hi.", voice="ryan")
            with pytest.raises(openai.NotFoundError):
                await sdk.models.retrieve("nope")
            # An alias stands for its model, on both APIs.
            metadata, _, _ = await h.synthesize(pcm(model="TTS-1", speaker="ryan"))
            assert metadata.model_name == "custom"
            body = await sdk.audio.speech.create(
                model="tts-1", input="Hi.", voice="ryan", response_format="pcm"
            )
            assert body.response.headers["x-model"] == "custom"

    run(main())


def test_models_are_listed_with_their_type_size_and_capabilities() -> None:
    async def main() -> None:
        async with Harness(models=MODELS, frames=FRAMES, http=True, default_model="custom") as h:
            listing = await h.stub.ListModels(tts_pb2.ListModelsRequest())
            assert listing.default_model == "custom"
            assert [(m.model_name, m.model_type, m.is_default) for m in listing.models] == [
                ("custom", "custom_voice", True),
                ("design", "voice_design", False),
                ("base", "base", False),
            ]
            base = await h.stub.GetModelInfo(tts_pb2.GetModelInfoRequest(model="base"))
            assert base.voice_clone_supported and base.voice_family == "0b6" and not base.is_default
            default = await h.stub.GetModelInfo(tts_pb2.GetModelInfoRequest())
            assert default.model_name == "custom" and not default.voice_clone_supported
            models = await client(h).models.list()
            by_id = {m.id: m.model_dump() for m in models.data}
            assert list(by_id) == ["custom", "design", "base"]
            assert by_id["custom"]["capabilities"]["preset_speakers"] and by_id["custom"]["default"]
            assert (
                by_id["design"]["capabilities"]["voice_design"] and by_id["design"]["type"] == "voice_design"
            )
            assert by_id["base"]["capabilities"]["voice_clone"] and by_id["base"]["size"] == "0b6"
            assert (await client(h).models.retrieve("base")).id == "base"

    run(main())


def test_design_then_clone_in_one_call_and_voices_keep_to_their_family() -> None:
    async def main() -> None:
        async with Harness(models=MODELS, frames=FRAMES, http=True, segment_tokens=8) as h:
            design = tts_pb2.VoiceDesign(instruct="A warm, low voice.", text="This is how I sound.", seed=7)
            voice = await h.stub.RegisterVoice(tts_pb2.RegisterVoiceRequest(name="warm", design=design))
            # 1. the VoiceDesign model spoke the sample text in the described voice ...
            (spoken,) = h.talkers["design"].requests
            assert (spoken.text, spoken.instruct, spoken.sampling.seed) == (design.text, design.instruct, 7)
            # 2. ... the Base model's speaker stage embedded that audio ...
            (embedded,) = h.speakers["base"].requests
            assert embedded.encoding == tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_FLOAT32 and embedded.want_codes
            np.testing.assert_array_equal(np.frombuffer(embedded.audio, "<f4"), expected_signal(FRAMES))
            # 3. ... and the voice is stored, in the Base model's family, with its design.
            assert (voice.model, voice.family, voice.ref_text) == ("base", "0b6", design.text)
            assert (voice.design.model, voice.design.seed, voice.design.instruct) == (
                "design",
                7,
                design.instruct,
            )
            listed = await h.stub.ListVoices(tts_pb2.ListVoicesRequest(model="base"))
            assert [v.voice_id for v in listed.voices] == [voice.voice_id] and listed.model == "base"
            assert not (await h.stub.ListVoices(tts_pb2.ListVoicesRequest(model="custom"))).voices
            # The voice speaks a long text through the Base model, segment after segment.
            text = "The first sentence is here. The second one follows it. And the third ends it."
            _, chunks, summary = await h.synthesize(pcm(text, model="base", voice_id=voice.voice_id))
            assert summary.num_segments == 3
            requests = h.talkers["base"].requests
            assert len(requests) == 3 and {tuple(r.speaker_embedding) for r in requests} == {
                tuple(np.float32(v) for v in embedded_embedding(h))
            }
            assert all(r.ref_text == design.text for r in requests)
            # Any other family refuses it, naming both.
            for model in ("custom", "design"):
                err = await expect_rpc_error(h.stub.Synthesize(pcm(model=model, voice_id=voice.voice_id)))
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert voice.voice_id in err.details() and f"model {model!r}" in err.details()
                assert "0b6 family" in err.details() and "'base'" in err.details()
            with pytest.raises(openai.BadRequestError, match="belongs to the 0b6 family"):
                await client(h).audio.speech.create(model="custom", input="Hi.", voice=voice.voice_id)

    run(main())


def embedded_embedding(h: Harness) -> list[float]:
    import hashlib

    digest = hashlib.sha256(h.speakers["base"].requests[0].audio).digest()
    return [b / 255.0 for b in digest[:8]]


def test_design_over_http_and_the_missing_model_is_named() -> None:
    async def main() -> None:
        async with Harness(models=MODELS, frames=FRAMES, http=True) as h:
            sdk = client(h)
            voice = await sdk.post(
                "/audio/voices",
                cast_to=object,
                options={"headers": {"Content-Type": "multipart/form-data"}},
                files=[
                    ("instructions", (None, b"A bright voice.")),
                    ("text", (None, b"Hello, it is me.")),
                    ("seed", (None, b"3")),
                    ("name", (None, b"bright")),
                ],  # fmt: skip
            )
            assert voice["type"] == "designed" and voice["model"] == "base"  # type: ignore[index]
            assert voice["design"]["seed"] == 3 and voice["design"]["model"] == "design"  # type: ignore[index]
            with pytest.raises(openai.BadRequestError, match="audio_sample .* or a design"):
                await sdk.post(
                    "/audio/voices",
                    cast_to=object,
                    options={"headers": {"Content-Type": "multipart/form-data"}},
                    files=[("name", (None, b"nothing"))],
                )
        async with Harness(models={"custom": "custom_voice", "base": "base"}, frames=FRAMES) as h:
            design = tts_pb2.VoiceDesign(instruct="A voice.", text="Hello.")
            err = await expect_rpc_error(h.stub.RegisterVoice(tts_pb2.RegisterVoiceRequest(design=design)))
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert (
                "no served model is a VoiceDesign model" in err.details()
                and "custom (custom_voice)" in err.details()
            )
        async with Harness(models={"design": "voice_design", "custom": "custom_voice"}, frames=FRAMES) as h:
            design = tts_pb2.VoiceDesign(instruct="A voice.", text="Hello.")
            err = await expect_rpc_error(h.stub.RegisterVoice(tts_pb2.RegisterVoiceRequest(design=design)))
            assert (
                err.code() == grpc.StatusCode.FAILED_PRECONDITION
                and "no served model is a Base model" in err.details()
            )
            assert not h.talkers["design"].requests  # refused before anything was spoken

    run(main())


async def _registry_start(talkers: dict[str, FakeTalker], decoder: FakeDecoder) -> None:
    """Start a registry over fake talkers (by name) and one fake decoder, then close it."""
    servers = []
    try:
        routes = []
        for name, talker in talkers.items():
            server, port = await start_fake(stages_pb2_grpc.add_TalkerServicer_to_server, talker)
            servers.append(server)
            routes.append(ModelRoute(name, (f"127.0.0.1:{port}",)))
        server, port = await start_fake(stages_pb2_grpc.add_DecoderServicer_to_server, decoder)
        servers.append(server)
        registry = ModelRegistry.from_config(
            GatewayConfig(models=tuple(routes), decoder_targets=(f"127.0.0.1:{port}",))
        )
        try:
            await registry.start()
        finally:
            await registry.close()
    finally:
        for server in servers:
            await server.stop(0)


def test_models_and_decoders_with_another_speech_tokenizer_are_refused() -> None:
    async def main() -> None:
        await _registry_start({"a": FakeTalker("base"), "b": FakeTalker("custom_voice")}, FakeDecoder())
        with pytest.raises(
            IncompatibleModelsError,
            match=r"decodes speech tokenizer 000000000000, but the served models \(a\) use",
        ):
            await _registry_start({"a": FakeTalker("base")}, FakeDecoder("0" * 64))
        other = FakeTalker("custom_voice")
        other.info.speech_tokenizer = "1" * 64
        with pytest.raises(
            IncompatibleModelsError, match=r"different speech tokenizers \(a: ffffffffffff, b: 111111111111\)"
        ):
            await _registry_start({"a": FakeTalker("base"), "b": other}, FakeDecoder())
        # Stages that report no fingerprint (older ones) are not checked.
        other.info.speech_tokenizer = ""
        await _registry_start({"a": FakeTalker("base"), "b": other}, FakeDecoder(""))

    run(main())


def test_models_flag() -> None:
    routes = parse_model_routes("design: talker=a:1; base: talker=b:1,b:2 speaker=c:1 ;")
    assert routes == (
        ModelRoute("design", ("a:1",)),
        ModelRoute("base", ("b:1", "b:2"), ("c:1",)),
    )
    for bad in (
        "x",
        "a: speaker=s:1",
        "a: talker=t:1; a: talker=t:2",
        "a b: talker=t:1",
        "a: talker=",
        "a: tlker=x",
    ):
        with pytest.raises(Exception, match="model"):
            parse_model_routes(bad)
    parse = FLAGS.parser()
    config = gateway_config_from_args(
        parse.parse_args(
            ["--models", "a: talker=t:1; b: talker=t:2", "--decoder-targets", "d:1", "--default-model", "b"]
        )
    )
    assert config.default_model == "b" and [m.name for m in config.models] == ["a", "b"]
    for extra, message in (
        (["--talker-targets", "t:3"], "without --talker-targets"),
        (["--default-model", "c"], "is not one of --models"),
        (["--model-alias", "x=c"], "no model 'c'"),
    ):
        args = parse.parse_args(["--models", "a: talker=t:1", "--decoder-targets", "d:1", *extra])
        with pytest.raises(ValueError, match=message):
            gateway_config_from_args(args)
