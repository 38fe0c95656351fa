"""One utterance through the stages: ``Talker.Generate`` piped into ``Decoder.Decode``.

:class:`SynthesisPipeline` opens both bidirectional calls, forwards every talker ``CodecChunk``
to the decoder the moment it arrives (a background task), sends ``DecodeEnd`` after
``TalkerDone``, and lets the caller iterate the decoder's ``PcmChunk``s. Whatever goes wrong
surfaces within one message: a failing stage (killed, restarted, rejecting the request) ends the
iteration with a :class:`StageError` naming the stage, even while the other stage is idle
waiting for input. :meth:`SynthesisPipeline.close` cancels both calls (after sending the talker a
``Cancel``), so a cancelled client frees its talker slot at once.

Streamed text (``TalkerRequest.text_open``): the ``text`` iterable's ``AppendText`` / ``EndText``
messages are written to the talker call as they come (a background task), after the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Sequence

import grpc

from tts_common.errors import TTSError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc

logger = logging.getLogger(__name__)

CANCEL_WRITE_TIMEOUT_S = 0.5
"""How long close() tries to deliver the Cancel message before cancelling the talker call."""

# Upstream statuses passed to the client unchanged (the stage's message, prefixed by its name).
_PASS_THROUGH = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DATA_LOSS,
}


class StageError(TTSError):
    """A stage call failed; reported to the client with ``grpc_status`` and a message that
    names the stage. Connection-level failures (and a stage cancelling on its own, e.g. while
    shutting down) become UNAVAILABLE."""

    def __init__(self, stage: str, code: grpc.StatusCode, details: str) -> None:
        self.stage = stage
        self.code = code if code in _PASS_THROUGH else grpc.StatusCode.UNAVAILABLE
        self.grpc_status = self.code.name  # type: ignore[misc]  # per-instance status
        if self.code is grpc.StatusCode.UNAVAILABLE:
            message = f"{stage} stage unavailable: {details}"
        else:
            message = f"{stage} stage: {details}"
        super().__init__(message)

    @classmethod
    def from_rpc_error(cls, stage: str, exc: grpc.aio.AioRpcError) -> StageError:
        return cls(stage, exc.code(), exc.details() or exc.code().name)


class SynthesisPipeline:
    """Talker -> decoder streaming for one request (see the module doc). Use as::

    pipeline = SynthesisPipeline(talker_stub, decoder_stub, talker_request, decode_start)
    try:
        await pipeline.start()
        async for pcm in pipeline.pcm_chunks(): ...
    finally:
        await pipeline.close()
    """

    def __init__(
        self,
        talker: stages_pb2_grpc.TalkerStub,
        decoder: stages_pb2_grpc.DecoderStub,
        talker_request: stages_pb2.TalkerRequest,
        decode_start: stages_pb2.DecodeStart,
        *,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        drain_timeout: float = 30.0,
        text: AsyncIterable[stages_pb2.TalkerClientMessage] | None = None,
    ) -> None:
        """``timeout``: deadline of both calls (the client's remaining time); ``drain_timeout``:
        how long the decoder may stay silent once it has all frames; ``text``: the text messages
        of a ``text_open`` request."""
        self._talker_stub = talker
        self._decoder_stub = decoder
        self._talker_request = talker_request
        self._decode_start = decode_start
        self._timeout = timeout
        self._metadata = tuple(metadata)
        self._drain_timeout = drain_timeout
        self._talker_call: grpc.aio.StreamStreamCall | None = None
        self._decoder_call: grpc.aio.StreamStreamCall | None = None
        self._pump: asyncio.Task[None] | None = None
        self._text = text
        self._text_task: asyncio.Task[None] | None = None
        self.talker_done: stages_pb2.TalkerDone | None = None
        """The talker's final message, once received."""

    async def start(self) -> None:
        """Open both calls and send the first messages (StageError if a stage is down)."""
        self._talker_call = self._talker_stub.Generate(timeout=self._timeout, metadata=self._metadata)
        self._decoder_call = self._decoder_stub.Decode(timeout=self._timeout, metadata=self._metadata)
        await self._write(
            "talker", self._talker_call, stages_pb2.TalkerClientMessage(request=self._talker_request)
        )
        await self._write(
            "decoder", self._decoder_call, stages_pb2.DecoderClientMessage(start=self._decode_start)
        )
        self._pump = asyncio.create_task(self._forward_frames(), name="talker->decoder")
        if self._text is not None:
            self._text_task = asyncio.create_task(self._forward_text(), name="text->talker")

    async def _forward_text(self) -> None:
        """The streamed text's messages -> talker. A failed write ends the task quietly: the
        talker call's failure reaches the caller through the frame pump."""
        assert self._text is not None and self._talker_call is not None
        with contextlib.suppress(StageError):
            async for message in self._text:
                await self._write("talker", self._talker_call, message)

    def _stop_text(self) -> None:
        if self._text_task is not None and not self._text_task.done():
            self._text_task.cancel()

    @staticmethod
    async def _write(stage: str, call: grpc.aio.StreamStreamCall, message: object) -> None:
        try:
            await call.write(message)
        except grpc.aio.AioRpcError as exc:
            raise StageError.from_rpc_error(stage, exc) from exc
        except asyncio.InvalidStateError as exc:  # the call already ended (half-closed)
            raise StageError(stage, grpc.StatusCode.UNAVAILABLE, str(exc)) from exc

    async def _forward_frames(self) -> None:
        """Talker chunks -> decoder as they arrive; then DecodeEnd."""
        assert self._talker_call is not None and self._decoder_call is not None
        while True:
            try:
                message = await self._talker_call.read()
            except grpc.aio.AioRpcError as exc:
                raise StageError.from_rpc_error("talker", exc) from exc
            if message is grpc.aio.EOF:
                raise StageError(
                    "talker", grpc.StatusCode.UNAVAILABLE, "the Generate stream ended without TalkerDone"
                )
            kind = message.WhichOneof("message")
            if kind == "chunk":
                await self._write(
                    "decoder", self._decoder_call, stages_pb2.DecoderClientMessage(chunk=message.chunk)
                )
            elif kind == "done":
                self.talker_done = message.done
                break
        self._stop_text()  # a cancelled or finished generation takes no more text
        await self._write(
            "decoder", self._decoder_call, stages_pb2.DecoderClientMessage(end=stages_pb2.DecodeEnd())
        )
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._decoder_call.done_writing()
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._talker_call.done_writing()

    async def pcm_chunks(self) -> AsyncIterator[stages_pb2.PcmChunk]:
        """The decoder's PCM chunks in order; returns after DecodeDone. Raises StageError as
        soon as either stage fails (the decoder idles while the talker is down, so the
        forwarding task is watched alongside every read)."""
        assert self._decoder_call is not None and self._pump is not None
        pump = self._pump
        while True:
            read = asyncio.ensure_future(self._decoder_call.read())
            try:
                while not read.done():
                    if pump.done():
                        if not pump.cancelled() and pump.exception() is not None:
                            raise pump.exception()  # type: ignore[misc]  # talker side failed
                        # All input is in: a healthy decoder answers quickly.
                        await asyncio.wait({read}, timeout=self._drain_timeout)
                        if not read.done():
                            raise StageError(
                                "decoder",
                                grpc.StatusCode.UNAVAILABLE,
                                f"no output for {self._drain_timeout:g} s after the end of input",
                            )
                    else:
                        await asyncio.wait({read, pump}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not read.done():
                    read.cancel()
                elif not read.cancelled():
                    read.exception()  # mark as retrieved (the pump's error is reported)
            message = self._read_result(read)
            kind = message.WhichOneof("message")
            if kind == "pcm":
                yield message.pcm
            elif kind == "done":
                await pump  # already finished: DecodeEnd is only sent after TalkerDone
                return

    @staticmethod
    def _read_result(read: asyncio.Future[object]) -> stages_pb2.DecoderServerMessage:
        try:
            message = read.result()
        except grpc.aio.AioRpcError as exc:
            raise StageError.from_rpc_error("decoder", exc) from exc
        if message is grpc.aio.EOF:
            raise StageError(
                "decoder", grpc.StatusCode.UNAVAILABLE, "the Decode stream ended without DecodeDone"
            )
        return message  # type: ignore[return-value]

    async def close(self) -> None:
        """Stop everything still running: Cancel + cancel the talker call (frees its slot),
        cancel the decoder call and the forwarding task. Idempotent, never raises."""
        talker, decoder, pump = self._talker_call, self._decoder_call, self._pump
        self._stop_text()  # no text write may run alongside the Cancel write
        if self._text_task is not None:
            with contextlib.suppress(BaseException):
                await self._text_task
        if talker is not None and not talker.done():
            try:
                await asyncio.wait_for(
                    talker.write(stages_pb2.TalkerClientMessage(cancel=stages_pb2.Cancel())),
                    CANCEL_WRITE_TIMEOUT_S,
                )
            except (
                grpc.aio.AioRpcError,
                asyncio.InvalidStateError,
                asyncio.TimeoutError,
                grpc.aio.UsageError,
            ):
                pass
            except asyncio.CancelledError:
                # Cancelled again while cleaning up: still cancel the calls, then re-raise.
                self._cancel_all(talker, decoder, pump)
                raise
        self._cancel_all(talker, decoder, pump)
        if pump is not None:
            with contextlib.suppress(BaseException):
                await pump

    @staticmethod
    def _cancel_all(
        talker: grpc.aio.StreamStreamCall | None,
        decoder: grpc.aio.StreamStreamCall | None,
        pump: asyncio.Task[None] | None,
    ) -> None:
        if talker is not None and not talker.done():
            talker.cancel()
        if decoder is not None and not decoder.done():
            decoder.cancel()
        if pump is not None and not pump.done():
            pump.cancel()


__all__ = ["StageError", "SynthesisPipeline"]
