"""Gateway access control: API keys (interceptor) and TLS on the public port."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.auth import extract_api_key
from tests.helpers.fake_stages import Harness, expect_rpc_error, run
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


def _self_signed(tmp_path: Path) -> tuple[str, str, bytes]:
    crypto = pytest.importorskip("cryptography")
    del crypto
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(key_pem)
    return str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"), cert_pem


def test_tls_public_port(tmp_path: Path) -> None:
    cert, key, cert_pem = _self_signed(tmp_path)
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
