"""The request flags of ``qwen3-tts say`` and the benches (qwen3_tts.request_flags): one spelling,
one meaning, one SynthesizeRequest."""

from __future__ import annotations

import argparse
from pathlib import Path

from qwen3_tts.cli import build_parser
from qwen3_tts.client import build_request
from qwen3_tts.request_flags import add_request_flags, request_from_flags
from tts_common.pb.qwen3tts.v1 import tts_pb2


def test_say_flags_make_the_request(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "say",
            "Hi.",
            "--model",
            "base",
            "--language",
            "English",
            "--greedy",
            "--seed",
            "7",
            "--max-new-tokens",
            "9",
            "--ref-audio",
            str(tmp_path / "ref.wav"),
            "--ref-text",
            "Words.",
        ]  # fmt: skip
    )
    (tmp_path / "ref.wav").write_bytes(b"RIFF")
    request = build_request(args)
    assert (request.model, request.text, request.language) == ("base", "Hi.", "English")
    assert request.output.encoding == tts_pb2.AUDIO_ENCODING_FLOAT32
    sampling = request.sampling
    assert (sampling.do_sample, sampling.subtalker_do_sample, sampling.seed, sampling.max_new_tokens) == (
        False, False, 7, 9,
    )  # fmt: skip
    assert request.clone.ref_audio == b"RIFF" and request.clone.ref_text == "Words."
    streamed = build_request(build_parser().parse_args(["say", "--stream-text", "--speaker", "ryan"]))
    assert streamed.text == "" and streamed.speaker == "ryan" and not streamed.sampling.HasField("seed")


def test_bench_defaults_and_the_voice_order() -> None:
    parser = argparse.ArgumentParser()
    add_request_flags(parser, language="english", seed=1234, cloning=False, greedy=False)
    args = parser.parse_args(["--instruct", "Calm.", "--voice-id", "voice-1", "--speaker", "ryan"])
    request = request_from_flags(args, text_feeding=tts_pb2.TEXT_FEEDING_STREAMING)
    assert (request.language, request.sampling.seed, request.instruct) == ("english", 1234, "Calm.")
    assert request.WhichOneof("voice") == "speaker"  # a preset speaker before a voice id
    assert request.text_feeding == tts_pb2.TEXT_FEEDING_STREAMING and request.model == ""
    assert not request.sampling.HasField("do_sample") and not request.sampling.HasField("max_new_tokens")
    assert request.output.encoding == tts_pb2.AUDIO_ENCODING_PCM16
