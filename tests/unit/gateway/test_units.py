"""Gateway building blocks without servers: flags/env parsing, stage routing, encoders and the
streaming resampler."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import grpc
import numpy as np
import pytest
import soundfile as sf

from gateway.__main__ import main as gateway_main
from gateway.config import FLAGS, GatewayConfig, gateway_config_from_args
from gateway.core.library import library_target
from gateway.encoding import AudioOutput, StreamResampler, WavEncoder, create_encoder
from gateway.stages.routing import StageClient, is_target_uri
from tts_common.audio import resample
from tts_common.chunking import MAX_CHUNK_FRAMES
from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2


def _parse(argv: list[str], env: dict[str, str] | None = None) -> GatewayConfig:
    _, args = FLAGS.parse(argv, env=env or {})
    return gateway_config_from_args(args)


def test_flags_env_and_defaults(tmp_path: object) -> None:
    config = _parse(["--talker-targets", "a:1, b:2", "--decoder-targets", "dns:///dec:3"])
    assert config.talker_targets == ("a:1", "b:2")
    assert config.decoder_targets == ("dns:///dec:3",)
    assert config.speaker_targets == ()
    assert (config.max_concurrent_streams, config.max_text_chars) == (64, 100_000)
    assert config.max_ref_audio_seconds == 60.0 and config.voices_dir is None
    assert not config.api_keys and config.tls_cert is None
    env = {
        "QWEN3TTS_TALKER_TARGETS": "t:1",
        "QWEN3TTS_DECODER_TARGETS": "d:1",
        "QWEN3TTS_SPEAKER_TARGETS": "s:1",
        "QWEN3TTS_GATEWAY_MAX_CONCURRENT_STREAMS": "8",
        "QWEN3TTS_API_KEYS": "k1,k2",
    }
    config = _parse([], env)
    assert (config.talker_targets, config.decoder_targets, config.speaker_targets) == (
        ("t:1",),
        ("d:1",),
        ("s:1",),
    )
    assert config.max_concurrent_streams == 8 and config.api_keys == {"k1", "k2"}
    assert _parse(["--max-concurrent-streams", "3"], env).max_concurrent_streams == 3
    with pytest.raises(ValueError, match="--talker-targets"):
        _parse(["--decoder-targets", "d:1"])
    with pytest.raises(ValueError, match="together"):
        _parse(["--talker-targets", "t:1", "--decoder-targets", "d:1", "--tls-cert", "x"])


def test_api_keys_file(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "keys"
    path.write_text("# comment\nalpha\n\n beta  # trailing\n")
    config = _parse(
        [
            "--talker-targets",
            "t:1",
            "--decoder-targets",
            "d:1",
            "--api-keys-file",
            str(path),
            "--api-keys",
            "gamma",
        ]
    )
    assert config.api_keys == {"alpha", "beta", "gamma"}


def test_voice_library_settings(tmp_path: Path) -> None:
    """Where the library is (one default, derived once), its settings, and their one check."""
    stages = ["--talker-targets", "t:1", "--decoder-targets", "d:1"]
    config = _parse(stages)
    assert (config.voices_db, config.voices_dir, library_target(config)) == (None, None, None)
    assert _parse([*stages, "--voices-dir", str(tmp_path)]).voices_db is None
    assert library_target(_parse([*stages, "--voices-dir", str(tmp_path)])) == str(tmp_path / "voices.db")
    url = "postgresql://u:p@db:5432/voices"
    env = {
        "QWEN3TTS_GATEWAY_VOICES_DB": url,
        "QWEN3TTS_GATEWAY_VOICES_OWNER_SECRET": "s" * 32,
        "QWEN3TTS_GATEWAY_VOICES_ADMIN_KEYS": "root",
        "QWEN3TTS_GATEWAY_MAX_VOICES_PER_KEY": "5",
        "QWEN3TTS_GATEWAY_VOICES_DB_TIMEOUT": "2.5",
        "QWEN3TTS_API_KEYS": "alpha",
    }
    config = _parse([*stages, "--voices-dir", str(tmp_path)], env)
    assert library_target(config) == url  # --voices-db wins over the directory's default
    assert config.api_keys == {"alpha", "root"}  # admin keys are accepted keys
    library = config.voice_library()
    assert (library.owner_secret, library.max_voices_per_owner, library.timeout_s) == (b"s" * 32, 5, 2.5)
    assert GatewayConfig().voice_library().max_voices_per_owner is None  # 0: no limit of its own
    assert GatewayConfig(voices_admin_keys=frozenset({"root"})).api_keys == {"root"}
    for bad in (["--voices-db-schema", "Bad-Schema"], ["--voices-owner-secret", "short"]):
        with pytest.raises(ValueError, match="voice library settings"):
            _parse([*stages, *bad])
    with pytest.raises(ValueError, match="must be at least 1"):
        GatewayConfig(max_voices_per_key=0, max_voices=0).voice_library()


def test_main_reports_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        gateway_main(["--decoder-targets", "d:1"])
    assert exc.value.code == 2
    assert "--talker-targets" in capsys.readouterr().err


def test_chunk_defaults_are_capped_and_positive() -> None:
    targets = ["--talker-targets", "t:1", "--decoder-targets", "d:1"]
    config = _parse([*targets, "--default-first-chunk-frames", "500", "--default-max-chunk-frames", "101"])
    assert config.default_first_chunk_frames == config.default_max_chunk_frames == MAX_CHUNK_FRAMES
    assert _parse([*targets, "--default-max-chunk-frames", "100"]).default_max_chunk_frames == 100
    with pytest.raises(SystemExit):
        _parse([*targets, "--default-first-chunk-frames", "0"])
    with pytest.raises(SystemExit):
        _parse(targets, {"QWEN3TTS_GATEWAY_MAX_REF_AUDIO_SECONDS": "nan"})


def test_parse_targets_and_uris() -> None:
    config = _parse(
        ["--talker-targets", " a:1 ,, b:2 ", "--decoder-targets", "d:1", "--speaker-targets", " , "]
    )
    assert config.talker_targets == ("a:1", "b:2") and config.speaker_targets == ()
    assert is_target_uri("dns:///talker:50052") and is_target_uri("unix:///tmp/s")
    assert not is_target_uri("talker:50052") and not is_target_uri("[::1]:5")


def test_stage_client_picks_least_loaded_round_robin() -> None:
    async def main() -> None:
        client = StageClient("talker", ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], lambda channel: channel)
        try:
            # idle endpoints are used in turn
            seen = []
            for _ in range(3):
                with client.lease() as endpoint:
                    seen.append(endpoint.target)
            assert sorted(seen) == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
            # long-running leases spread over the endpoints, then the least loaded is chosen
            with client.lease() as a, client.lease() as b, client.lease() as c:
                assert len({a.target, b.target, c.target}) == 3
                assert client.in_flight == 3
                a.in_flight += 5
                with client.lease() as d:
                    assert d.target != a.target
            assert client.in_flight == 5  # only the manual bump is left
        finally:
            await client.close()
        with pytest.raises(ValueError, match="must be the only target"):
            StageClient("talker", ["dns:///x:1", "y:2"], lambda channel: channel)
        uri = StageClient("talker", ["dns:///localhost:1"], lambda channel: channel)
        with uri.lease() as endpoint:
            assert isinstance(endpoint.channel, grpc.aio.Channel)
        await uri.close()

    asyncio.run(main())


def _signal(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.2).astype(np.float32)


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 48000])
def test_stream_resampler_matches_whole_signal(rate: int) -> None:
    x = _signal(1920 * 18)
    sizes = [1920, 3840, 1920 * 5, 7, 1920 * 3 - 7, 0, 1920 * 7]
    resampler = StreamResampler(24000, rate)
    parts, i = [], 0
    for n in sizes:
        parts.append(resampler.process(x[i : i + n]))
        i += n
    assert i == x.size
    parts.append(resampler.flush())
    np.testing.assert_allclose(np.concatenate(parts), resample(x, 24000, rate), atol=1e-6)


def test_output_chunks_concatenate_for_every_encoding() -> None:
    x = _signal(1920 * 9, seed=1)
    for encoding in (
        tts_pb2.AUDIO_ENCODING_PCM16,
        tts_pb2.AUDIO_ENCODING_FLOAT32,
        tts_pb2.AUDIO_ENCODING_WAV,
        tts_pb2.AUDIO_ENCODING_FLAC,
        tts_pb2.AUDIO_ENCODING_OGG_VORBIS,
        tts_pb2.AUDIO_ENCODING_OGG_OPUS,
    ):
        for rate in (24000, 16000):
            output = AudioOutput(encoding, rate)
            data, total = b"", 0
            for i in range(0, x.size, 1920 * 2):
                chunk, n = output.process(x[i : i + 1920 * 2])
                data, total = data + chunk, total + n
            chunk, n = output.finish()
            data, total = data + chunk, total + n
            assert total == int(np.ceil(x.size * rate / 24000)), (encoding, rate)
            if encoding in (tts_pb2.AUDIO_ENCODING_PCM16, tts_pb2.AUDIO_ENCODING_FLOAT32):
                width = 2 if encoding == tts_pb2.AUDIO_ENCODING_PCM16 else 4
                assert len(data) == total * width
                continue
            with sf.SoundFile(io.BytesIO(data)) as fh:
                assert fh.samplerate == rate
                decoded = fh.read(dtype="float32") if encoding != tts_pb2.AUDIO_ENCODING_WAV else None
            if decoded is not None:
                assert abs(decoded.size - total) <= 960, (encoding, rate)


def test_wav_without_samples_is_a_header() -> None:
    encoder = WavEncoder(24000)
    assert len(encoder.finish()) == 44
    encoder = WavEncoder(24000)
    assert len(encoder.encode(np.zeros(0, np.float32))) == 44
    assert encoder.finish() == b""


def test_unsupported_output_formats() -> None:
    with pytest.raises(InvalidRequestError, match="OGG_OPUS"):
        create_encoder(tts_pb2.AUDIO_ENCODING_OGG_OPUS, 22050)
    with pytest.raises(InvalidRequestError, match="unknown output.encoding"):
        create_encoder(99, 24000)
    # no audio at all: Ogg still gives its headers; libsndfile writes nothing for FLAC
    data, n = AudioOutput(tts_pb2.AUDIO_ENCODING_OGG_VORBIS, 24000).finish()
    assert n == 0 and data[:4] == b"OggS"
    assert AudioOutput(tts_pb2.AUDIO_ENCODING_FLAC, 24000).finish() == (b"", 0)
