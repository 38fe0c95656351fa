"""A 20,000-character text through the real four-process stack on the dev checkpoint: every segment
in order, ``start_sample`` continuous, the same audio as synthesizing the segments one by one with
their derived seeds; and ``qwen3-tts synthesize --text-file`` writes the segments' audio as one WAV.

Each segment gets ``max_new_tokens = 3`` (2 frames): enough to prove the orchestration, cheap on
two CPU cores."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import soundfile as sf

from qwen3_tts.dev_model import make_dev_model
from tests.helpers.stack import running_stack
from tests.helpers.synthesis import chunks_audio
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc
from tts_common.synthesis.segments import PROMPT_FIXED_POSITIONS, max_segment_tokens, segment_seed
from tts_common.text import segment_text
from tts_common.text.tokenizer import TextTokenizer

SEED = 424242
MAX_NEW_TOKENS = 3
SAMPLING = tts_pb2.SamplingOptions(seed=SEED, max_new_tokens=MAX_NEW_TOKENS)
FLOAT32 = tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32)
SENTENCES = (
    "Chapter {n} begins on a quiet morning, when Dr. Lee opened the shutters of the old house.",
    "The thermometer read {n}.5 degrees, e.g. warmer than the day before; nobody complained.",
    "Was it really {n} years since the U.S. office had moved to www.example.com/offices?",
    "She laughed... then she wrote {n} pages, slowly, carefully, and without a single pause!",
    "第{n}章开始了。天气很好，我们去公园散步。",
    "“Come in,” he said. “The kettle is on, and there are {n} cups on the table.”",
)


def long_text(chars: int = 20_000) -> str:
    paragraphs, n = [], 0
    while sum(len(p) + 2 for p in paragraphs) < chars:
        n += 1
        paragraphs.append(" ".join(s.format(n=n) for s in SENTENCES))
    return "\n\n".join(paragraphs)[:chars].rsplit(" ", 1)[0]


def synthesize(stub: tts_pb2_grpc.TextToSpeechStub, text: str, seed: int = SEED):
    """(metadata count, audio chunks, summary) of one Synthesize call."""
    sampling = tts_pb2.SamplingOptions(seed=seed, max_new_tokens=MAX_NEW_TOKENS)
    request = tts_pb2.SynthesizeRequest(
        text=text, speaker="Ryan", language="English", sampling=sampling, output=FLOAT32
    )
    metas, chunks, summary = 0, [], None
    for response in stub.Synthesize(request, timeout=120):
        kind = response.WhichOneof("payload")
        if kind == "metadata":
            metas += 1
        elif kind == "audio":
            chunks.append(response.audio)
        else:
            summary = response.summary
    return metas, chunks, summary


@pytest.fixture(scope="module")
def dev_model(tmp_path_factory):
    return make_dev_model(tmp_path_factory.mktemp("dev") / "custom_voice", "custom_voice")


@pytest.fixture(scope="module")
def dev_stack(dev_model, tmp_path_factory):
    with running_stack(dev_model, tmp_path_factory.mktemp("long_logs")) as stack:
        yield stack


def test_20k_characters_stream_as_one_continuous_utterance(dev_model, dev_stack):
    text = long_text()
    assert 19_900 <= len(text) <= 20_000
    with grpc.insecure_channel(dev_stack.address("gateway")) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        began = time.monotonic()
        metas, chunks, summary = synthesize(stub, text)
        elapsed = time.monotonic() - began
        assert elapsed < 60, elapsed
        audio = chunks_audio(chunks)

        # One metadata, chunks continuous, the summary's totals.
        assert metas == 1 and summary is not None
        position = 0
        for chunk in chunks:
            assert chunk.start_sample == position
            position += chunk.num_samples
        assert summary.num_samples == audio.size == position
        segments = list(summary.segments)
        assert summary.num_segments == len(segments) > 20
        assert summary.frames == sum(s.frames for s in segments)

        # Every segment present, in order: the segments tile the text (whitespace aside) and the audio.
        assert [s.index for s in segments] == list(range(len(segments)))
        assert " ".join(text[s.text_start : s.text_end] for s in segments).split() == text.split()
        assert all(a.text_end <= b.text_start for a, b in zip(segments, segments[1:]))
        starts = [s.start_sample for s in segments]
        assert starts[0] == 0 and all(
            s.start_sample + s.num_samples == t for s, t in zip(segments, starts[1:] + [audio.size])
        )
        assert [s.seed for s in segments] == [segment_seed(SEED, k) for k in range(len(segments))]
        # Cut by the talker's own tokenizer (fetched with GetTokenizer) to the default size.
        tokenizer = TextTokenizer.from_checkpoint(dev_model)
        expected = segment_text(
            text, max_segment_tokens(2048, PROMPT_FIXED_POSITIONS), tokenizer.count_tokens
        )
        assert [(s.text_start, s.text_end) for s in segments] == [(p.start, p.end) for p in expected]

        # The same audio as each segment synthesized alone with its derived seed (several at once:
        # the talker is batch-invariant, and the suite stays fast).
        def alone(segment: tts_pb2.SegmentSummary) -> tuple[int, np.ndarray]:
            metas, chunks, summary = synthesize(
                stub, text[segment.text_start : segment.text_end], segment.seed
            )
            assert metas == 1 and summary.num_segments == 1
            return segment.index, chunks_audio(chunks)

        with ThreadPoolExecutor(8) as pool:
            for index, one in pool.map(alone, segments):
                s = segments[index]
                assert one.size == s.num_samples, index
                np.testing.assert_allclose(
                    audio[s.start_sample : s.start_sample + s.num_samples], one, atol=1e-4
                )


def test_offline_text_file_is_the_segments_one_by_one(dev_model, dev_stack, tmp_path):
    # A shorter text cut small (--segment-tokens) keeps this fast; the cut is the same code path.
    text, size = long_text(1500), 40
    tokenizer = TextTokenizer.from_checkpoint(dev_model)
    pieces = segment_text(text, size, tokenizer.count_tokens)
    assert len(pieces) > 5
    text_file, out = tmp_path / "chapter.txt", tmp_path / "chapter.wav"
    text_file.write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwen3_tts.cli",
            "synthesize",
            "--model",
            str(dev_model),
            "--text-file",
            str(text_file),
            "--out",
            str(out),
            "--speaker",
            "Ryan",
            "--language",
            "English",
            "--seed",
            str(SEED),
            "--max-new-tokens",
            str(MAX_NEW_TOKENS),
            "--segment-tokens",
            str(size),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{len(pieces)} segments" in proc.stdout, proc.stdout
    offline, rate = sf.read(out, dtype="float32")
    with grpc.insecure_channel(dev_stack.address("gateway")) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)

        def alone(k: int) -> np.ndarray:
            return chunks_audio(synthesize(stub, pieces[k].text, segment_seed(SEED, k))[1])

        with ThreadPoolExecutor(8) as pool:
            expected = np.concatenate(list(pool.map(alone, range(len(pieces)))))
    assert rate == 24000 and offline.shape == expected.shape
    np.testing.assert_allclose(offline, expected, atol=1e-4)
