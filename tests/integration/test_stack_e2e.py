"""The real stack (gateway, talker, decoder, speaker as processes) on loopback, end to end.

* greedy Synthesize returns the offline command's audio (float32 within 1e-4; PCM16 within one
  quantisation step), and the first audio chunk arrives while the talker is still generating;
* the same for a cloned voice through the speaker stage (ICL: reference codes as decoder context);
* reflection lists the services as grpcurl does; health reports SERVING per service;
* a cancelled stream frees the talker slot.
"""

from __future__ import annotations

import subprocess
import sys

import grpc
import numpy as np
import pytest
import soundfile as sf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.helpers.fixtures import CKPT_DIR, REFERENCE_DIR
from tests.helpers.stack import running_stack, wait_for
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

GREEDY = tts_pb2.SamplingOptions(do_sample=False, subtalker_do_sample=False, max_new_tokens=80)
FLOAT32 = tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32)


def offline(tmp_path, model, *args) -> np.ndarray:
    out = tmp_path / "offline.wav"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "qwen3_tts.cli",
            "synthesize",
            "--model",
            str(model),
            "--out",
            str(out),
            "--greedy",
            "--max-new-tokens",
            "80",
            *args,
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    wav, _ = sf.read(out, dtype="float32")
    return wav


def synthesize(stub, request, on_first_audio=None):
    """(metadata, audio pieces, summary) of one Synthesize call."""
    meta, pieces, summary = None, [], None
    for response in stub.Synthesize(request, timeout=120):
        kind = response.WhichOneof("payload")
        if kind == "metadata":
            meta = response.metadata
        elif kind == "audio":
            if not pieces and on_first_audio is not None:
                on_first_audio()
            pieces.append(response.audio)
        else:
            summary = response.summary
    return meta, pieces, summary


@pytest.fixture(scope="module")
def cv_stack(tmp_path_factory):
    with running_stack(CKPT_DIR / "tiny_custom_voice", tmp_path_factory.mktemp("cv_logs")) as stack:
        yield stack


@pytest.fixture(scope="module")
def base_stack(tmp_path_factory):
    with running_stack(CKPT_DIR / "tiny_base", tmp_path_factory.mktemp("base_logs")) as stack:
        yield stack


def talker_running(stack) -> int:
    with grpc.insecure_channel(stack.address("talker")) as ch:
        return (
            stages_pb2_grpc.TalkerStub(ch).GetStats(stages_pb2.GetStatsRequest(), timeout=5).running_requests
        )


def test_synthesize_matches_offline(cv_stack, tmp_path):
    text = "Hello world, this is a quick test."
    expected = offline(
        tmp_path, CKPT_DIR / "tiny_custom_voice", "--text", text, "--speaker", "Ryan", "--language", "English"
    )
    with grpc.insecure_channel(cv_stack.address("gateway")) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.SynthesizeRequest(
            text=text, speaker="Ryan", language="English", sampling=GREEDY, output=FLOAT32
        )
        meta, pieces, summary = synthesize(stub, request)
    audio = np.concatenate([np.frombuffer(p.data, "<f4") for p in pieces])
    assert meta.sample_rate == 24000 and len(pieces) > 1
    assert audio.shape == expected.shape
    assert np.abs(audio - expected).max() <= 1e-4
    assert summary.frames * 1920 == len(audio)
    assert summary.finish_reason in (tts_pb2.FINISH_REASON_EOS, tts_pb2.FINISH_REASON_LENGTH)
    assert 0 < summary.time_to_first_audio_ms < summary.total_ms
    # Matches the official fixture too (same request as cv_en_ryan_nonstream).
    np.testing.assert_allclose(
        audio, np.load(REFERENCE_DIR / "tiny_custom_voice/cv_en_ryan_nonstream/wav_0.npy"), atol=1e-4
    )

    # PCM16 (default encoding): the same signal within one quantisation step.
    with grpc.insecure_channel(cv_stack.address("gateway")) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        _, pieces16, _ = synthesize(
            stub, tts_pb2.SynthesizeRequest(text=text, speaker="Ryan", language="English", sampling=GREEDY)
        )
    pcm = np.concatenate([np.frombuffer(p.data, "<i2") for p in pieces16]).astype(np.float32) / 32767
    assert pcm.shape == expected.shape and np.abs(pcm - expected).max() <= 1 / 32767 + 1e-4


def test_the_first_audio_arrives_while_the_talker_still_generates(cv_stack):
    """Streamed out: the first chunk reaches the client before the talker is done. A long
    utterance: the fixture's 20 frames take the tiny talker less time than the first chunk's way
    to the client on a fast CPU (a Zen 5 finished them first); this seed runs to the length cap
    (599 frames offline)."""
    running_at_first_audio = []
    with grpc.insecure_channel(cv_stack.address("gateway")) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.SynthesizeRequest(
            text="Hello world, this is a quick test.",
            speaker="Ryan",
            language="English",
            sampling=tts_pb2.SamplingOptions(seed=7, max_new_tokens=600),
            silence_stop=False,
        )
        _, pieces, summary = synthesize(
            stub, request, lambda: running_at_first_audio.append(talker_running(cv_stack))
        )
    assert running_at_first_audio == [1], f"{summary.frames} frames"
    assert len(pieces) > 1


def test_voice_clone_through_speaker_stage_matches_offline(base_stack, tmp_path):
    ref = REFERENCE_DIR / "tiny_base" / "ref_24k.wav"
    text, ref_text = "She said she would be here by noon.", "This is what my voice sounds like."
    expected = offline(
        tmp_path,
        CKPT_DIR / "tiny_base",
        "--text",
        text,
        "--language",
        "English",
        "--ref-audio",
        str(ref),
        "--ref-text",
        ref_text,
    )
    with grpc.insecure_channel(base_stack.address("gateway")) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.SynthesizeRequest(
            text=text,
            language="English",
            sampling=GREEDY,
            output=FLOAT32,
            clone=tts_pb2.VoiceClone(ref_audio=ref.read_bytes(), ref_text=ref_text),
        )
        _, pieces, summary = synthesize(stub, request)
        # A registered voice gives the same audio.
        voice = stub.RegisterVoice(
            tts_pb2.RegisterVoiceRequest(
                name="me", reference=tts_pb2.VoiceClone(ref_audio=ref.read_bytes(), ref_text=ref_text)
            ),
            timeout=60,
        )
        _, pieces2, _ = synthesize(
            stub,
            tts_pb2.SynthesizeRequest(
                text=text, language="English", sampling=GREEDY, output=FLOAT32, voice_id=voice.voice_id
            ),
        )
    audio = np.concatenate([np.frombuffer(p.data, "<f4") for p in pieces])
    audio2 = np.concatenate([np.frombuffer(p.data, "<f4") for p in pieces2])
    assert audio.shape == expected.shape and np.abs(audio - expected).max() <= 1e-4
    np.testing.assert_allclose(audio, np.load(REFERENCE_DIR / "tiny_base/vc_icl_stream/wav_0.npy"), atol=1e-4)
    np.testing.assert_array_equal(audio, audio2)


def test_reflection_and_health(cv_stack):
    expected_services = {
        "gateway": "qwen3tts.v1.TextToSpeech",
        "talker": "qwen3tts.internal.v1.Talker",
        "decoder": "qwen3tts.internal.v1.Decoder",
        "speaker": "qwen3tts.internal.v1.Speaker",
    }
    for name, service in expected_services.items():
        with grpc.insecure_channel(cv_stack.address(name)) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
            listed = {s.name for r in responses for s in r.list_services_response.service}
            assert {service, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= listed
            responses = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=service)]), timeout=10
            )
            assert next(iter(responses)).file_descriptor_response.file_descriptor_proto
            health = health_pb2_grpc.HealthStub(channel)
            for svc in ("", service):
                status = health.Check(health_pb2.HealthCheckRequest(service=svc), timeout=5).status
                assert status == health_pb2.HealthCheckResponse.SERVING, (name, svc)


def test_cancel_mid_stream_frees_talker_slot(cv_stack):
    with grpc.insecure_channel(cv_stack.address("gateway")) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.SynthesizeRequest(
            text="The quick brown fox jumps over the lazy dog. " * 3,
            speaker="Ryan",
            sampling=tts_pb2.SamplingOptions(seed=1, max_new_tokens=2000),
        )
        call = stub.Synthesize(request, timeout=120)
        got_audio = False
        for response in call:
            if response.WhichOneof("payload") == "audio":
                got_audio = True
                break
        assert got_audio
        assert talker_running(cv_stack) == 1
        call.cancel()
    assert wait_for(lambda: talker_running(cv_stack) == 0, timeout=10)


def test_invalid_requests_get_clear_statuses(cv_stack):
    with grpc.insecure_channel(cv_stack.address("gateway")) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        cases = [
            (tts_pb2.SynthesizeRequest(text="", speaker="Ryan"), grpc.StatusCode.INVALID_ARGUMENT, "text"),
            (
                tts_pb2.SynthesizeRequest(text="Hi.", speaker="Nobody"),
                grpc.StatusCode.INVALID_ARGUMENT,
                "speaker",
            ),
            (
                tts_pb2.SynthesizeRequest(text="Hi.", speaker="Ryan", language="Klingon"),
                grpc.StatusCode.INVALID_ARGUMENT,
                "language",
            ),
            (
                tts_pb2.SynthesizeRequest(text="Hi.", speaker="Ryan", instruct="whisper"),
                grpc.StatusCode.INVALID_ARGUMENT,
                "instruct",
            ),
            (
                tts_pb2.SynthesizeRequest(
                    text="Hi.", speaker="Ryan", sampling=tts_pb2.SamplingOptions(temperature=0)
                ),
                grpc.StatusCode.INVALID_ARGUMENT,
                "temperature",
            ),
            (tts_pb2.SynthesizeRequest(text="Hi.", voice_id="nope"), None, None),
        ]
        for request, code, word in cases:
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Synthesize(request, timeout=30))
            assert info.value.code() != grpc.StatusCode.INTERNAL, info.value.details()
            if code is not None:
                assert info.value.code() == code, info.value.details()
                assert word in info.value.details().lower()
