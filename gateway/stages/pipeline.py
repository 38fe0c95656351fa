"""One utterance through the stages: ``Talker.Generate`` piped into ``Decoder.Decode``, surviving
the loss of a stage replica.

:class:`SynthesisPipeline` opens both bidirectional calls, forwards every talker ``CodecChunk``
to the decoder the moment it arrives (a background task), sends ``DecodeEnd`` after
``TalkerDone``, and lets the caller iterate the decoder's ``PcmChunk``s. A stage the pipeline
cannot do without (rejecting the request, or with no replica left) ends the iteration within one
message with a :class:`StageError` naming the stage, even while the other stage is idle waiting
for input. :meth:`SynthesisPipeline.close` cancels both calls (after sending the talker a
``Cancel``), so a cancelled client frees its talker slot at once.

Failover (:mod:`gateway.stages.failover`): the frames forwarded so far are kept (bounded). When a call
fails at the connection level (the replica died, hung past the keepalive timeout, or is shutting
down; not a request error), the pipeline moves it to another healthy replica of the stage:

* decoder: ``Decode`` is opened again with the same ``DecodeStart``, every forwarded frame is
  replayed (and ``DecodeEnd`` if it was sent), and the samples the caller already has are
  dropped; exact streaming makes the rest equal to what the lost replica would have sent;
* talker: the same ``TalkerRequest`` (same prompt, same seed) goes to another replica, whose
  frames must equal those already forwarded (checked, then skipped); if they differ the stream
  ends with UNAVAILABLE saying so, so differing audio is never spliced.

Both are bounded (``FailoverPolicy``: attempts per stage, waiting time for a healthy replica,
frames kept), logged with the request id and counted in ``qwen3tts_failovers_total``; the delay
until the replacement's first new output goes to ``qwen3tts_failover_seconds``.

Streamed text (``TalkerRequest.text_open``): the ``text`` iterable's ``AppendText`` / ``EndText``
messages are written to the talker call as they come (a background task), after the request. The
messages sent are kept, so a talker failover sends the replacement the request and then all of
them at once: streamed text gives the same frames however its text arrives (the talker's
incremental tokenizer commits a token only when later text cannot change it), so the regenerated
frames still match the forwarded ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Any, TypeVar

import grpc

from tts_common import metrics
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc

from ..config import FailoverPolicy
from .errors import StageError
from .failover import FrameLog, record_failover, trim_pcm
from .routing import Endpoint, StageClient
from .stage_call import StageCall, stage_replicas

logger = logging.getLogger(__name__)

StubT = TypeVar("StubT")

CANCEL_WRITE_TIMEOUT_S = 0.5
"""How long close() tries to deliver the Cancel message before cancelling the talker call."""


class SynthesisPipeline:
    """Talker -> decoder streaming for one request (see the module doc). Use as::

    async with SynthesisPipeline(talker_client, decoder_client, talker_request, decode_start) as pipeline:
        await pipeline.start()
        async for pcm in pipeline.pcm_chunks(): ...
    """

    def __init__(
        self,
        talker: StageClient[stages_pb2_grpc.TalkerStub] | stages_pb2_grpc.TalkerStub,
        decoder: StageClient[stages_pb2_grpc.DecoderStub] | stages_pb2_grpc.DecoderStub,
        talker_request: stages_pb2.TalkerRequest,
        decode_start: stages_pb2.DecodeStart,
        *,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        drain_timeout: float = 30.0,
        failover: FailoverPolicy | None = None,
        text: AsyncIterable[stages_pb2.TalkerClientMessage] | None = None,
    ) -> None:
        """``talker`` / ``decoder``: the stages' replicas (the pipeline picks and replaces them),
        or a stub each (one call per stage, no failover: the interface before failover);
        ``timeout``: deadline of the whole utterance (the client's remaining time), given to
        every stage call; ``drain_timeout``: how long the decoder may stay silent once it has
        all frames; ``failover``: the bounds of replica failover (default
        :class:`FailoverPolicy`); ``text``: the text messages of a ``text_open`` request."""
        self._talker: StageCall[stages_pb2_grpc.TalkerStub] = StageCall(
            "talker", stage_replicas("talker", talker)
        )
        self._decoder: StageCall[stages_pb2_grpc.DecoderStub] = StageCall(
            "decoder", stage_replicas("decoder", decoder)
        )
        self._talker_request = talker_request
        self._decode_start = decode_start
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._metadata = tuple(metadata)
        self._drain_timeout = drain_timeout
        self._policy = failover or FailoverPolicy()
        if not (isinstance(talker, StageClient) and isinstance(decoder, StageClient)):
            self._policy = dataclasses.replace(self._policy, attempts=0)
        # Without failover nothing replays or compares the frames: the log only counts them.
        self._frames = FrameLog(self._policy.max_frames if self._policy.attempts > 0 else 0)
        self._end_sent = False
        self._decoder_lock = asyncio.Lock()
        self._decoder_replaced = asyncio.Event()
        self._delivered = 0
        self._recovering: dict[str, float] = {}
        self._pump: asyncio.Task[None] | None = None
        self._text = text
        self._text_task: asyncio.Task[None] | None = None
        self._text_sent: list[stages_pb2.TalkerClientMessage] = []
        self._talker_lock = asyncio.Lock()
        """Orders text writes against a talker failover's replay of the request and the text."""
        self.talker_done: stages_pb2.TalkerDone | None = None
        """The talker's final message, once received."""

    async def __aenter__(self) -> SynthesisPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def request_id(self) -> str:
        return self._talker_request.request_id

    @property
    def failovers(self) -> dict[str, int]:
        """Replacement calls opened so far, per stage."""
        return {"talker": self._talker.failovers, "decoder": self._decoder.failovers}

    def _remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.001)

    # --- opening calls, failing over ----------------------------------------------------------------
    async def start(self) -> None:
        """Open both calls and send the first messages (StageError if a stage is down and no
        replica takes over)."""
        await self._connect(self._talker, None)
        await self._connect(self._decoder, None)
        self._pump = asyncio.create_task(self._run_talker(), name="talker->decoder")
        if self._text is not None:
            self._text_task = asyncio.create_task(self._forward_text(), name="text->talker")

    async def _connect(self, side: StageCall[Any], cause: StageError | None) -> None:
        """Open ``side``'s call and send what it needs to catch up (the request; the start, the
        forwarded frames and the end seen so far); after ``cause``, a connection-level failure of
        its current call, on a replacement replica. Failures while opening fail over too."""
        while True:
            if cause is None:
                endpoint = side.client.acquire()
            else:
                endpoint = await self._replacement(side, cause)
            method = endpoint.stub.Generate if side is self._talker else endpoint.stub.Decode
            side.replace(endpoint, method(timeout=self._remaining(), metadata=self._metadata))
            try:
                await self._send_opening(side)
                return
            except StageError as exc:
                if not exc.connection_failure:
                    raise
                cause = exc

    async def _send_opening(self, side: StageCall[Any]) -> None:
        call = side.call
        assert call is not None
        if side is self._talker:
            async with self._talker_lock:
                await self._write(side, call, stages_pb2.TalkerClientMessage(request=self._talker_request))
                for message in self._text_sent:
                    await self._write(side, call, message)
            return
        await self._write(side, call, stages_pb2.DecoderClientMessage(start=self._decode_start))
        for chunk in self._frames.chunks():
            await self._write(side, call, stages_pb2.DecoderClientMessage(chunk=chunk))
        if self._end_sent:
            await self._write(side, call, stages_pb2.DecoderClientMessage(end=stages_pb2.DecodeEnd()))
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.done_writing()

    async def _replacement(self, side: StageCall[StubT], cause: StageError) -> Endpoint[StubT]:
        """A replica to move ``side``'s failed call to, or the StageError that ends the stream."""
        failed = side.endpoint
        target = failed.target if failed is not None else "?"
        if failed is not None:
            side.client.mark_failed(failed)
            if failed not in side.failed:
                side.failed.append(failed)
        side.drop()
        detail = f"{target} failed after {self._frames.frames} frames ({cause.details})"
        if self._policy.attempts <= 0:
            raise cause.final(cause.details)
        if not self._frames.complete:
            record_failover(side.stage, "not_replayable", self.request_id, detail)
            raise cause.final(
                f"{cause.details} (no failover: the stream is past the {self._policy.max_frames} "
                "frames kept for replay)"
            )
        if side.failovers >= self._policy.attempts:
            record_failover(side.stage, "exhausted", self.request_id, detail)
            raise cause.final(f"{cause.details} (failover gave up after {side.failovers} replacement calls)")
        wait = self._policy.wait_seconds
        remaining = self._remaining()
        endpoint = await side.client.acquire_replacement(
            side.failed, wait if remaining is None else min(wait, remaining)
        )
        if endpoint is None:
            record_failover(side.stage, "exhausted", self.request_id, f"{detail}; no healthy replica")
            raise cause.final(f"{cause.details} (no healthy {side.stage} replica within {wait:g} s)")
        side.failovers += 1
        self._recovering.setdefault(side.stage, time.monotonic())
        record_failover(
            side.stage,
            "ok",
            self.request_id,
            f"{detail}; attempt {side.failovers}/{self._policy.attempts} on {endpoint.target}",
        )
        return endpoint

    def _recovered(self, stage: str) -> None:
        """The first new output after a failover of ``stage``: observe how long it took."""
        started = self._recovering.pop(stage, None)
        if started is None:
            return
        seconds = time.monotonic() - started
        metrics.FAILOVER_SECONDS.labels(stage=metrics.STAGE_GATEWAY, peer=stage).observe(seconds)
        logger.info("failover %s request %s: resumed after %.3f s", stage, self.request_id, seconds)

    async def _forward_text(self) -> None:
        """The streamed text's messages -> talker, each kept for a failover's replay first. A
        failed write is left to the frame pump, which sees the same failure and replaces the
        call (replaying the kept messages) or ends the stream."""
        assert self._text is not None
        async for message in self._text:
            async with self._talker_lock:
                self._text_sent.append(message)
                call = self._talker.call
                if call is None:
                    continue
                with contextlib.suppress(StageError):
                    await self._write(self._talker, call, message)

    def _stop_text(self) -> None:
        if self._text_task is not None and not self._text_task.done():
            self._text_task.cancel()

    @staticmethod
    async def _write(side: StageCall[Any], call: grpc.aio.StreamStreamCall, message: object) -> None:
        try:
            await call.write(message)
        except grpc.aio.AioRpcError as exc:
            raise await side.error(call, exc) from exc
        except (asyncio.InvalidStateError, grpc.aio.UsageError) as exc:  # the call already ended
            if call.done() and await call.code() is not grpc.StatusCode.OK:
                raise await side.error(call) from exc
            raise StageError(
                side.stage, grpc.StatusCode.UNAVAILABLE, f"the call ended early ({exc})"
            ) from exc

    # --- talker -> decoder ----------------------------------------------------------------------
    async def _run_talker(self) -> None:
        """Talker chunks -> decoder as they arrive (after a talker failover: the regenerated
        frames checked against the forwarded ones and skipped); then DecodeEnd."""
        generation, received = self._talker.generation, 0
        while True:
            if self._talker.generation != generation:
                generation, received = self._talker.generation, 0
            try:
                message = await self._read_talker()
            except StageError as exc:
                if not exc.connection_failure:
                    raise
                await self._connect(self._talker, exc)
                continue
            kind = message.WhichOneof("message")
            if kind == "chunk":
                chunk = message.chunk
                if chunk.start_frame != received:
                    raise StageError(
                        "talker",
                        grpc.StatusCode.INTERNAL,
                        f"chunk starts at frame {chunk.start_frame}, expected {received}",
                    )
                mismatch = self._frames.first_mismatch(received, chunk.codes)
                if mismatch is not None:
                    raise self._refuse_splice(f"frame {mismatch} differs")
                received += chunk.codes.num_frames
                new = FrameLog.tail(chunk, self._frames.frames)
                if new is not None:
                    self._recovered("talker")
                    await self._forward(stages_pb2.DecoderClientMessage(chunk=new), new.codes)
            elif kind == "done":
                if received < self._frames.frames:
                    raise self._refuse_splice(
                        f"it ended after {received} frames, {self._frames.frames} were already forwarded"
                    )
                self.talker_done = message.done
                self._recovered("talker")
                break
        self._stop_text()  # a cancelled or finished generation takes no more text
        await self._forward(stages_pb2.DecoderClientMessage(end=stages_pb2.DecodeEnd()), None)
        call = self._talker.call
        if call is not None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.done_writing()

    async def _read_talker(self) -> stages_pb2.TalkerServerMessage:
        call = self._talker.call
        assert call is not None
        try:
            message = await call.read()
        except grpc.aio.AioRpcError as exc:
            raise await self._talker.error(call, exc) from exc
        if message is grpc.aio.EOF:
            raise StageError(
                "talker", grpc.StatusCode.UNAVAILABLE, "the Generate stream ended without TalkerDone"
            )
        return message  # type: ignore[no-any-return]

    def _refuse_splice(self, what: str) -> StageError:
        """The end of a stream whose replacement talker does not repeat the forwarded frames."""
        target = self._talker.endpoint.target if self._talker.endpoint is not None else "?"
        record_failover("talker", "refused", self.request_id, f"{target}: {what}")
        return StageError(
            "talker",
            grpc.StatusCode.UNAVAILABLE,
            f"failover to {target} regenerated different codec frames ({what}; do the talker "
            "replicas serve different checkpoints?); the stream ends here rather than splice "
            "different audio",
            connection_failure=False,
        )

    async def _forward(
        self, message: stages_pb2.DecoderClientMessage, codes: stages_pb2.Codes | None
    ) -> None:
        """Send a chunk (logged first, so a replay includes it) or the end to the decoder. If
        the decoder call is broken, pcm_chunks() replaces it and replays the log: wait for that."""
        async with self._decoder_lock:
            if codes is not None:
                self._frames.append(codes)
            else:
                self._end_sent = True
            generation, call = self._decoder.generation, self._decoder.call
            assert call is not None
            try:
                await self._write(self._decoder, call, message)
                if codes is None:
                    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                        await call.done_writing()
                return
            except StageError as exc:
                failure = exc
        # The reader sees the same failure on its side of the call and replaces it.
        deadline = time.monotonic() + max(self._drain_timeout, self._policy.wait_seconds)
        while self._decoder.generation == generation:
            replaced = self._decoder_replaced
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise failure.final(f"{failure.details} (and the call was not replaced)")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(replaced.wait(), remaining)

    # --- decoder -> caller ----------------------------------------------------------------------
    async def pcm_chunks(self) -> AsyncIterator[stages_pb2.PcmChunk]:
        """The decoder's PCM chunks in order, each sample once (across decoder failovers);
        returns after DecodeDone. Raises StageError as soon as either stage fails for good (the
        decoder idles while the talker is down, so the forwarding task is watched alongside every
        read)."""
        assert self._pump is not None
        pump = self._pump
        generation, position = self._decoder.generation, 0
        while True:
            if self._decoder.generation != generation:
                generation, position = self._decoder.generation, 0
            message, failure = await self._read_decoder(pump)
            if failure is not None:
                if not failure.connection_failure:
                    raise failure
                async with self._decoder_lock:
                    await self._connect(self._decoder, failure)
                replaced, self._decoder_replaced = self._decoder_replaced, asyncio.Event()
                replaced.set()
                continue
            assert message is not None
            kind = message.WhichOneof("message")
            if kind == "pcm":
                pcm = message.pcm
                piece = trim_pcm(pcm, position, self._delivered)
                position += pcm.num_samples or len(pcm.samples) // 4
                if piece is not None:
                    self._delivered += piece.num_samples
                    self._recovered("decoder")
                    yield piece
            elif kind == "done":
                await pump  # already finished: DecodeEnd is only sent after TalkerDone
                self._recovered("decoder")
                return

    async def _read_decoder(
        self, pump: asyncio.Task[None]
    ) -> tuple[stages_pb2.DecoderServerMessage | None, StageError | None]:
        """The next decoder message, or the decoder's failure; raises the forwarding task's
        error (the talker failed for good) as soon as it happens."""
        call = self._decoder.call
        assert call is not None
        read = asyncio.ensure_future(call.read())
        try:
            while not read.done():
                if pump.done():
                    if not pump.cancelled() and pump.exception() is not None:
                        raise pump.exception()  # type: ignore[misc]  # talker side failed
                    # All input is in: a healthy decoder answers quickly.
                    await asyncio.wait({read}, timeout=self._drain_timeout)
                    if not read.done():
                        return None, StageError(
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
        try:
            message = read.result()
        except grpc.aio.AioRpcError as exc:
            return None, await self._decoder.error(call, exc)
        if message is grpc.aio.EOF:
            return None, StageError(
                "decoder", grpc.StatusCode.UNAVAILABLE, "the Decode stream ended without DecodeDone"
            )
        return message, None  # type: ignore[return-value]

    # --- teardown -------------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop everything still running: Cancel + cancel the talker call (frees its slot),
        cancel the decoder call and the forwarding task, end the replicas' in-flight counts.
        Idempotent, never raises."""
        talker, pump = self._talker.call, self._pump
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
                self._cancel_all(pump)
                raise
        self._cancel_all(pump)
        if pump is not None:
            with contextlib.suppress(BaseException):
                await pump

    def _cancel_all(self, pump: asyncio.Task[None] | None) -> None:
        if pump is not None and not pump.done():
            pump.cancel()
        self._talker.drop()
        self._decoder.drop()


__all__ = ["StageError", "SynthesisPipeline"]
