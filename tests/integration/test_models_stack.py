"""One real stack with three dev models (``qwen3-tts up --dev-model-type
voice_design,base,custom_voice``: a talker per model, the Base model's speaker stage, one decoder
pool) behind one gateway: each model by name over gRPC and over HTTP with the ``openai`` SDK, a
voice designed and cloned in one call speaking a three-segment text through the Base model, an
unknown model NOT_FOUND / 404, and a voice refused by a model of another family."""

from __future__ import annotations

import grpc
import numpy as np
import openai
import pytest

from qwen3_tts.cli import build_parser
from qwen3_tts.local_stack import served_models
from tests.helpers.stack import running_stack
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

SAMPLING = tts_pb2.SamplingOptions(seed=11, max_new_tokens=24)
FLOAT32 = tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32)
VOICES = {"voice_design": {"instruct": "A calm, low voice."}, "custom_voice": {"speaker": "vivian"}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    dev = tmp_path_factory.mktemp("dev_models")
    args = build_parser().parse_args(
        ["up", "--dev-model-type", "voice_design,base,custom_voice", "--dev-model-dir", str(dev)]
    )
    models = served_models(args)
    # Small segments: a three-sentence text is spoken as three segments.
    with running_stack(
        models, tmp_path_factory.mktemp("logs"), gateway_args=["--segment-tokens", "14"]
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def stub(stack):
    with grpc.insecure_channel(stack.address("gateway")) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


def synthesize(stub, **fields) -> tuple[tts_pb2.SynthesisMetadata, np.ndarray, tts_pb2.SynthesisSummary]:
    responses = list(
        stub.Synthesize(tts_pb2.SynthesizeRequest(sampling=SAMPLING, output=FLOAT32, **fields), timeout=120)
    )
    audio = np.frombuffer(b"".join(r.audio.data for r in responses if r.HasField("audio")), "<f4")
    return responses[0].metadata, audio, responses[-1].summary


def test_three_models_behind_one_gateway_and_one_decoder_pool(stack, stub) -> None:
    assert [s.name for s in stack.stages if s.name.startswith("decoder")] == ["decoder"]
    listing = stub.ListModels(tts_pb2.ListModelsRequest(), timeout=10)
    assert [(m.model_name, m.model_type) for m in listing.models] == [
        ("voice_design", "voice_design"),
        ("base", "base"),
        ("custom_voice", "custom_voice"),
    ]
    assert listing.default_model == "voice_design" and listing.models[1].voice_clone_supported
    for name, voice in VOICES.items():
        metadata, audio, summary = synthesize(stub, model=name, text="Hello there.", **voice)
        assert (metadata.model_name, metadata.model_type) == (name, name)
        assert audio.size == summary.num_samples > 0
    sdk = openai.OpenAI(base_url=stack.http_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for name, voice in (("voice_design", "alloy"), ("custom_voice", "vivian")):
        reply = sdk.audio.speech.create(
            model=name,
            input="Hello there.",
            voice=voice,
            instructions=VOICES[name].get("instruct", ""),
            response_format="pcm",
            extra_body={"seed": 11, "max_new_tokens": 24},
        )
        assert reply.response.headers["x-model"] == name and len(reply.content) > 0
    with pytest.raises(openai.NotFoundError, match="unknown model 'tts-1'.*voice_design, base, custom_voice"):
        sdk.audio.speech.create(model="tts-1", input="Hi.", voice="vivian")
    with pytest.raises(grpc.RpcError) as err:
        synthesize(stub, model="tts-1", text="Hi.", speaker="vivian")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_designed_voice_speaks_three_segments_through_the_base_model(stack, stub) -> None:
    design = tts_pb2.VoiceDesign(instruct="A bright, quick voice.", text="This is my voice.", seed=5)
    voice = stub.RegisterVoice(tts_pb2.RegisterVoiceRequest(name="designed", design=design), timeout=120)
    assert (voice.model, voice.design.model, voice.ref_text) == ("base", "voice_design", design.text)
    assert voice.family and voice.ref_audio_seconds > 0
    listed = stub.ListVoices(tts_pb2.ListVoicesRequest(model="base"), timeout=10)
    assert voice.voice_id in [v.voice_id for v in listed.voices]
    text = "The first part is here. The second part follows. The third part ends it."
    metadata, audio, summary = synthesize(stub, model="base", text=text, voice_id=voice.voice_id)
    assert metadata.model_name == "base"
    assert summary.num_segments == 3 and audio.size == summary.num_samples
    assert [s.start_sample for s in summary.segments] == [
        sum(s.num_samples for s in summary.segments[:k]) for k in range(3)
    ]
    for model in ("custom_voice", "voice_design"):
        with pytest.raises(grpc.RpcError) as err:
            synthesize(stub, model=model, text="Hi.", voice_id=voice.voice_id)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert voice.voice_id in err.value.details() and f"model {model!r}" in err.value.details()
