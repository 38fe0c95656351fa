"""Gateway access control: API keys (interceptor) and TLS on the public port."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.transports.auth import extract_api_key
from qwen3_tts.cli import build_parser, cmd_health
from tests.helpers.fake_stages import Harness, expect_rpc_error, run
from tests.helpers.tls import self_signed
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc


def test_api_keys() -> None:
    async def main() -> None:
        async with Harness(api_keys=frozenset({"key-one", "key-two"})) as h:
            info = tts_pb2.GetModelInfoRequest()
            err = await expect_rpc_error(h.stub.GetModelInfo(info))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization: Bearer KEY" in err.details()
            err = await expect_rpc_error(h.stub.GetModelInfo(info, metadata=[("x-api-key", "wrong")]))
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            err = await expect_rpc_error(
                h.stub.GetModelInfo(info, metadata=[("authorization", "Basic key-one")])
            )
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = await h.stub.GetModelInfo(info, metadata=[("authorization", "Bearer key-one")])
            assert ok.model_type == "custom_voice"
            await h.stub.ListVoices(tts_pb2.ListVoicesRequest(), metadata=[("x-api-key", "key-two")])
            # streaming RPCs too
            request = tts_pb2.SynthesizeRequest(text="Hi", speaker="ryan")
            err = await expect_rpc_error(h.stub.Synthesize(request))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert not h.talker.requests
            await h.synthesize(request, metadata=[("authorization", "bearer key-two")])
            # health stays open
            health = health_pb2_grpc.HealthStub(h.channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

    run(main())


def test_extract_api_key() -> None:
    assert extract_api_key(None) is None
    assert extract_api_key([("authorization", "Bearer  abc ")]) == "abc"
    assert extract_api_key([("x-api-key", b"xyz")]) == "xyz"
    assert extract_api_key([("x-api-key", "xyz"), ("authorization", "Bearer abc")]) == "abc"
    assert extract_api_key([("authorization", "Bearer")]) is None


def test_tls_public_port(tmp_path: Path) -> None:
    cert, key, cert_pem = self_signed(tmp_path)
    creds = grpc.ssl_channel_credentials(root_certificates=cert_pem)

    async def main() -> None:
        async with Harness(tls_cert=cert, tls_key=key, client_credentials=creds) as h:
            meta, chunks, _ = await h.synthesize(tts_pb2.SynthesizeRequest(text="Hi", speaker="ryan"))
            assert chunks
            async with grpc.aio.insecure_channel(f"127.0.0.1:{h.port}") as plain:
                err = await expect_rpc_error(
                    tts_pb2_grpc.TextToSpeechStub(plain).GetModelInfo(
                        tts_pb2.GetModelInfoRequest(), timeout=2
                    )
                )
                assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    run(main())


def test_health_command_speaks_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert, key, _ = self_signed(tmp_path)

    async def main() -> None:
        async with Harness(tls_cert=cert, tls_key=key, http=True) as h:
            url = h.http_url + "/health"
            assert url.startswith("https://")

            async def health(*flags: str, address: str = f"127.0.0.1:{h.port}") -> int:
                args = build_parser().parse_args(["health", address, "--timeout", "2", *flags])
                return await asyncio.to_thread(cmd_health, args)  # blocking client: off the loop

            assert await health("--tls-ca", cert) == 0
            assert await health("--tls-ca", cert, "--tls-server-name", "localhost") == 0
            assert await health("--tls-ca", cert, "--tls-server-name", "other.example") == 1
            assert await health() == 1  # plaintext against a TLS port
            assert await health("--tls") == 1  # the system roots do not vouch for it
            with pytest.raises(ValueError, match="together"):
                await health("--tls-cert", cert)
            # the HTTP API on the same certificate: an https:// URL takes the same flags
            assert await health("--tls-ca", cert, address=url) == 0
            assert await health("--tls-ca", cert, "--tls-server-name", "localhost", address=url) == 0
            assert await health("--tls-ca", cert, "--tls-server-name", "other.example", address=url) == 1
            assert await health(address=url) == 1  # the system roots do not vouch for it
            with pytest.raises(ValueError, match="together"):
                await health("--tls-key", key, address=url)

    run(main())
    assert "SERVING" in capsys.readouterr().out
