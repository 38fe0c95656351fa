"""What a client is told about a failed stage call (issue 29, "no internals in any error"): the
stage and what happened, and the request id to quote; never grpc-core's details (stage
addresses, debug strings), which go to the log under the request id. The statuses themselves
(and so failover) are those of test_failover and test_http_mapping."""

from __future__ import annotations

import json
import logging
import re

import grpc
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect

from gateway.stages.errors import StageError
from tests.helpers.fake_stages import Harness, expect_rpc_error, run
from tests.unit.gateway.test_http_websocket import read_until_closed, ws_url
from tts_common.logging_setup import RequestContextFilter, request_context
from tts_common.pb.qwen3tts.v1 import tts_pb2

ADDRESS = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}|\b(?:ipv4|ipv6|unix|dns):|\[[0-9a-fA-F:]+\]|:\d{2,5}\b")
"""A network address or grpc-core's spelling of one."""
GRPC_CORE = re.compile(
    r"failed to connect|last error|grpc_status|created_time|Connection refused|Socket closed"
)
"""grpc-core's own words."""

_hosts = st.one_of(
    st.ip_addresses(v=4).map(lambda a: f"ipv4:{a}"),
    st.ip_addresses(v=6).map(lambda a: f"ipv6:[{a}]"),
    st.from_regex(r"unix:/[a-z]{1,8}/[a-z]{1,8}\.sock", fullmatch=True),
)
GRPC_CORE_DETAILS = st.one_of(
    st.builds(
        lambda host, port: (
            f"failed to connect to all addresses; last error: UNKNOWN: {host}:{port}: "
            "Failed to connect to remote host: Connection refused"
        ),
        _hosts,
        st.integers(1, 65535),
    ),
    st.builds(
        lambda host, port: json.dumps(
            {"created_time": "2026-11-26T03:00:00Z", "grpc_status": 14, "peer": f"{host}:{port}"}
        ),
        _hosts,
        st.integers(1, 65535),
    ),
    st.just("Socket closed"),
)
"""Details grpc-core gives a failed call (connect failures, debug strings)."""

STAGES = st.sampled_from(["talker", "decoder", "speaker", "aligner"])


def assert_clean(message: str, stage: str, request_id: str) -> None:
    assert not ADDRESS.search(message), message
    assert not GRPC_CORE.search(message), message
    assert f"{stage} stage" in message and request_id in message, message


@given(
    stage=STAGES,
    code=st.sampled_from([c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]),
    details=GRPC_CORE_DETAILS,
)
def test_a_stage_error_tells_the_client_the_stage_never_the_address(
    stage: str, code: grpc.StatusCode, details: str
) -> None:
    rpc_error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, details)
    with request_context("req-7"):
        error = StageError.from_rpc_error(stage, rpc_error)
        final = error.final(f"{error.details} (failover gave up after 2 replacement calls)")
    for message in (str(error), str(final)):
        assert_clean(message, stage, "req-7")
    assert error.details and final.code is error.code  # the details stay with the error, for the log


def test_unavailable_says_retry_later_and_a_verdict_keeps_the_stages_words() -> None:
    with request_context("req-8"):
        down = StageError("talker", grpc.StatusCode.CANCELLED, "ipv4:10.0.0.5:50051: Socket closed")
        verdict = StageError("speaker", grpc.StatusCode.INVALID_ARGUMENT, "reference audio too short")
    assert down.code is grpc.StatusCode.UNAVAILABLE and down.connection_failure
    assert str(down) == "the talker stage is unavailable; retry later (request id req-8)"
    assert str(verdict) == "speaker stage: reference audio too short"


def test_the_details_go_to_the_log_with_the_request_id(caplog: pytest.LogCaptureFixture) -> None:
    details = "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:50051: refused"
    caplog.handler.addFilter(RequestContextFilter())
    with caplog.at_level(logging.INFO, logger="gateway.stages.errors"), request_context("req-9"):
        StageError("decoder", grpc.StatusCode.UNAVAILABLE, details, connection_failure=False)
    logged = [r for r in caplog.records if "10.0.0.5:50051" in r.getMessage()]
    assert logged and all(r.request_id == "req-9" for r in logged), caplog.records  # type: ignore[attr-defined]


def test_a_stage_down_reaches_no_client_with_its_address(caplog: pytest.LogCaptureFixture) -> None:
    """gRPC, HTTP and the WebSocket, against a real refused connection (grpc-core's details)."""

    async def main() -> None:
        async with Harness(http=True, failover_wait_seconds=0.1) as h:
            target = h.decoder_server_target
            await h.decoder_server.stop(0)
            request = tts_pb2.SynthesizeRequest(text="Hi.", speaker="vivian")
            failure = await expect_rpc_error(h.stub.Synthesize(request, metadata=[("x-request-id", "req-g")]))
            assert failure.code() is grpc.StatusCode.UNAVAILABLE
            assert_clean(failure.details() or "", "decoder", "req-g")
            async with httpx2.AsyncClient(base_url=h.http_url) as client:
                response = await client.post(
                    "/v1/audio/speech",
                    json={"input": "Hi.", "voice": "vivian", "response_format": "pcm"},
                    headers={"x-request-id": "req-h"},
                )
            assert response.status_code == 503, response.text
            assert_clean(response.json()["error"]["message"], "decoder", "req-h")
            async with connect(ws_url(h)) as ws:
                await ws.send(json.dumps({"type": "config", "voice": "vivian", "request_id": "req-w"}))
                await ws.send(json.dumps({"type": "text", "text": "Hi."}))
                await ws.send(json.dumps({"type": "end"}))
                messages = await read_until_closed(ws)
            errors = [json.loads(m) for m in messages if isinstance(m, str) and '"error"' in m]
            assert errors, messages
            for error in errors:
                assert_clean(json.dumps(error), "decoder", "req-w")
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert target in logged  # the operator still sees where

    with caplog.at_level(logging.INFO):
        run(main())
