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


def test_a_model_tags_the_records_of_its_requests() -> None:
    import io
    import logging

    from tts_common.logging_setup import model_context, setup_logging

    stream = io.StringIO()
    handler = setup_logging("INFO", stage="gateway", stream=stream)
    try:
        log = logging.getLogger("test.models")
        with request_context("r-1"):
            log.info("before")
            with model_context("base"):
                log.info("inside")
            log.info("after")
        with model_context("base"):
            log.info("no request")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert [line.split("test.models", 1)[1] for line in lines] == [
        " [req=r-1] before",
        " [req=r-1 model=base] inside",
        " [req=r-1] after",
        " [model=base] no request",
    ]
