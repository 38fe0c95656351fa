"""What failing over a stage call needs, independent of the pipeline that does it.

Our stages are deterministic, so a replacement replica can rebuild a stream: the decoder's audio
is a pure function of the codec frames (exact streaming), and the talker's frames for a request
and seed are the same on any replica and in any batch (batch-invariant sampling). This module
holds the pieces :mod:`gateway.stages.pipeline` (and the calls of :mod:`gateway.stages.speaker` and
:mod:`gateway.stages.aligner`) use
(how far to go, :class:`~gateway.config.FailoverPolicy`, lives with the configuration):

* :func:`is_connection_failure` — which gRPC statuses mean "the replica or the connection to it
  went away" (fail over) rather than "the request is wrong" (report it);
* :class:`FrameLog` — the codec frames forwarded for one stream, bounded, for replay to a new
  decoder and for checking a new talker's frames against those already forwarded;
* :func:`trim_pcm` — the part of a replayed decoder chunk the client does not have yet;
* :func:`call_with_failover` — a unary call retried on other replicas (stateless stages), and
  :func:`call_stateless_stage`, the whole call of the speaker and aligner stages over it (deadline,
  request id, the error named after the stage), with :func:`stage_timeout` its deadline;
* :func:`record_failover` — the log line and the count of one failover.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import numpy as np

from tts_common import metrics
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.serving.request_ids import REQUEST_ID_METADATA_KEY

from .errors import CONNECTION_FAILURES, StageError, is_connection_failure
from .routing import Endpoint, StageClient

if TYPE_CHECKING:
    from ..config import FailoverPolicy

logger = logging.getLogger(__name__)

T = TypeVar("T")
StubT = TypeVar("StubT")

REPLAY_CHUNK_FRAMES = 50
"""Frames per CodecChunk when replaying to a new decoder (4 s of audio per message)."""


class FrameLog:
    """The codec frames forwarded for one stream, in order, up to ``max_frames`` of them.

    :attr:`frames` counts every frame appended; :attr:`complete` says whether all of them are
    still kept (a stream longer than the bound cannot be replayed or checked any more).
    """

    def __init__(self, max_frames: int) -> None:
        self.max_frames = max_frames
        self.frames = 0
        self._codebooks = 0
        self._data = np.zeros((0, 0), dtype=np.int32)

    @property
    def complete(self) -> bool:
        """Whether every frame appended so far is kept."""
        return self.frames <= self.max_frames

    def append(self, codes: stages_pb2.Codes) -> None:
        """Record the frames of one forwarded chunk (in order)."""
        n, q = int(codes.num_frames), int(codes.num_codebooks)
        first, self.frames = self.frames, self.frames + n
        if n <= 0 or first >= self.max_frames:
            return
        if not self._codebooks:
            self._codebooks = q
            self._data = np.zeros((min(64, self.max_frames), q), dtype=np.int32)
        values = np.asarray(codes.values, dtype=np.int32).reshape(n, q)
        keep = values[: self.max_frames - first]
        end = first + keep.shape[0]
        if end > self._data.shape[0]:
            grown = np.zeros((min(max(end, 2 * self._data.shape[0]), self.max_frames), q), dtype=np.int32)
            grown[:first] = self._data[:first]
            self._data = grown
        self._data[first:end] = keep

    def first_mismatch(self, start_frame: int, codes: stages_pb2.Codes) -> int | None:
        """Compare frames ``start_frame ...`` of ``codes`` with the logged ones (only the part
        that overlaps the log): the index of the first differing frame, or None if equal."""
        n, q = int(codes.num_frames), int(codes.num_codebooks)
        overlap = min(n, self.frames - start_frame)
        if overlap <= 0:
            return None
        if q != self._codebooks or not self.complete:
            return start_frame
        values = np.asarray(codes.values, dtype=np.int32).reshape(n, q)[:overlap]
        logged = self._data[start_frame : start_frame + overlap]
        rows = np.flatnonzero(np.any(values != logged, axis=1))
        return start_frame + int(rows[0]) if rows.size else None

    def chunks(self, frames_per_chunk: int = REPLAY_CHUNK_FRAMES) -> Iterator[stages_pb2.CodecChunk]:
        """The logged frames as CodecChunk messages (for a replay; needs :attr:`complete`)."""
        if not self.complete:
            raise ValueError("the frame log is incomplete")
        for start in range(0, self.frames, frames_per_chunk):
            block = self._data[start : min(start + frames_per_chunk, self.frames)]
            yield stages_pb2.CodecChunk(
                start_frame=start,
                codes=stages_pb2.Codes(
                    num_frames=block.shape[0], num_codebooks=block.shape[1], values=block.reshape(-1).tolist()
                ),
            )

    @staticmethod
    def tail(chunk: stages_pb2.CodecChunk, from_frame: int) -> stages_pb2.CodecChunk | None:
        """The frames of ``chunk`` from absolute index ``from_frame`` on (None if none)."""
        codes = chunk.codes
        n, q = int(codes.num_frames), int(codes.num_codebooks)
        skip = max(from_frame - chunk.start_frame, 0)
        if skip >= n:
            return None
        if skip == 0:
            return chunk
        return stages_pb2.CodecChunk(
            start_frame=chunk.start_frame + skip,
            codes=stages_pb2.Codes(num_frames=n - skip, num_codebooks=q, values=codes.values[skip * q :]),
        )


def trim_pcm(pcm: stages_pb2.PcmChunk, position: int, delivered: int) -> stages_pb2.PcmChunk | None:
    """The part of ``pcm`` — which covers output samples ``[position, position + num_samples)``
    of a (replayed) decode — past the first ``delivered`` samples, which the client already has.
    None when all of it was delivered. Chunks hold whole frames, and so does every cut."""
    n = pcm.num_samples or len(pcm.samples) // 4
    skip = delivered - position
    if skip <= 0:
        return pcm
    if skip >= n:
        return None
    samples_per_frame = n // pcm.num_frames if pcm.num_frames else 0
    frames = skip // samples_per_frame if samples_per_frame else 0
    return stages_pb2.PcmChunk(
        samples=pcm.samples[skip * 4 :],
        sample_rate=pcm.sample_rate,
        start_sample=pcm.start_sample + skip,
        num_samples=n - skip,
        start_frame=pcm.start_frame + frames,
        num_frames=max(pcm.num_frames - frames, 0),
    )


def record_failover(peer: str, result: str, request_id: str, detail: str) -> None:
    """Log one failover of a ``peer`` stage call (with the request id) and count it
    (``qwen3tts_failovers_total{peer, result}``). The time until the replacement's first new
    output (``qwen3tts_failover_seconds``) is observed by the pipeline, which sees that output."""
    metrics.FAILOVERS.labels(stage=metrics.STAGE_GATEWAY, peer=peer, result=result).inc()
    level = logging.INFO if result == "ok" else logging.WARNING
    logger.log(level, "failover %s request %s: %s %s", peer, request_id, result, detail)


async def call_with_failover(
    client: StageClient[StubT],
    policy: FailoverPolicy,
    request_id: str,
    call: Callable[[Endpoint[StubT]], Awaitable[T]],
) -> T:
    """``await call(endpoint)`` on a replica of a stateless stage; a connection-level failure
    moves it to another replica (at most ``policy.attempts`` times, each waiting at most
    ``policy.wait_seconds`` for a healthy one). Other errors, and the last connection-level one,
    propagate as :class:`grpc.aio.AioRpcError`."""
    failed: list[Endpoint[StubT]] = []
    endpoint = client.acquire()
    while True:
        try:
            return await call(endpoint)
        except grpc.aio.AioRpcError as exc:
            if not is_connection_failure(exc.code()):
                raise
            client.mark_failed(endpoint)
            failed.append(endpoint)
            detail = f"{endpoint.target} failed ({exc.code().name}: {exc.details()})"
            if len(failed) > policy.attempts:
                record_failover(client.stage, "exhausted", request_id, f"{detail}; no attempt left")
                raise
            replacement = await client.acquire_replacement(failed, policy.wait_seconds)
            if replacement is None:
                record_failover(client.stage, "exhausted", request_id, f"{detail}; no healthy replica")
                raise
            record_failover(client.stage, "ok", request_id, f"{detail}; retrying on {replacement.target}")
        finally:
            client.release(endpoint)
        endpoint = replacement


def stage_timeout(limit: float, time_remaining: float | None) -> float:
    """A stage call's deadline: ``limit``, or the client's remaining time if shorter."""
    return limit if time_remaining is None else max(min(limit, time_remaining), 0.001)


async def call_stateless_stage(
    client: StageClient[StubT],
    policy: FailoverPolicy,
    rpc: Callable[[StubT], Callable[..., Awaitable[T]]],
    request: Any,
    request_id: str,
    timeout: float,
) -> T:
    """``rpc(stub)(request)``, one unary call of a stateless stage (speaker, aligner): the
    request id in its metadata, ``timeout`` its deadline (:func:`stage_timeout`), failed over
    by :func:`call_with_failover`; a gRPC error becomes a :class:`StageError` naming the
    client's stage."""

    async def call(endpoint: Endpoint[StubT]) -> T:
        return await rpc(endpoint.stub)(
            request, timeout=timeout, metadata=((REQUEST_ID_METADATA_KEY, request_id),)
        )

    try:
        return await call_with_failover(client, policy, request_id, call)
    except grpc.aio.AioRpcError as exc:
        raise StageError.from_rpc_error(client.stage, exc) from exc


__all__ = [
    "CONNECTION_FAILURES",
    "FrameLog",
    "call_stateless_stage",
    "call_with_failover",
    "is_connection_failure",
    "record_failover",
    "stage_timeout",
    "trim_pcm",
]
