"""Request ids in log records: ``request_context`` inside async generators."""

from __future__ import annotations

import asyncio

from tts_common.logging_setup import current_request_id, request_context


def test_request_context_survives_finalisation_from_another_task() -> None:
    """grpc finalises abandoned response generators from another task; leaving the block there
    must neither raise nor change that task's request id."""

    async def stream():
        with request_context("req-1"):
            yield current_request_id()
            yield current_request_id()

    async def main() -> None:
        gen = stream()
        assert await asyncio.create_task(anext(gen)) == "req-1"
        with request_context("other"):
            await asyncio.create_task(gen.aclose())  # GeneratorExit inside the block, other context
            assert current_request_id() == "other"
        assert current_request_id() is None

    asyncio.run(main())
