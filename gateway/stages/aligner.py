"""The aligner stage (optional, one pool shared by every served model): an utterance's audio and
text to the time each word (or character) is heard, called once per complete utterance of a
request asking for ``timestamps``, retried on another replica when one is lost (the stage is
stateless)."""

from __future__ import annotations

import numpy as np

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc

from ..config import FailoverPolicy
from .failover import call_stateless_stage, stage_timeout
from .routing import StageClient


class AlignerStage:
    """The aligner stage's replicas (see the module doc)."""

    def __init__(
        self,
        client: StageClient[stages_pb2_grpc.AlignerStub],
        timeout_seconds: float,
        *,
        failover: FailoverPolicy | None = None,
    ) -> None:
        """``timeout_seconds``: the deadline of one Align call; ``failover``: how a call that
        fails at the connection level is retried on another replica (default
        :class:`FailoverPolicy`)."""
        self.client = client
        self.timeout_seconds = timeout_seconds
        self.failover = failover or FailoverPolicy()

    async def align(
        self,
        samples: np.ndarray,
        sample_rate: int,
        text: str,
        language: str,
        unit: int,
        request_id: str,
        time_remaining: float | None = None,
    ) -> stages_pb2.AlignResponse:
        """The units of ``text`` timed in ``samples`` (mono float32 at ``sample_rate``);
        ``unit``: a ``stages_pb2.AlignUnit``. StageError naming the aligner on failure."""
        request = stages_pb2.AlignRequest(
            request_id=request_id,
            pcm=np.ascontiguousarray(samples, dtype="<f4").tobytes(),
            sample_rate=sample_rate,
            text=text,
            language=language,
            unit=unit,
        )
        reply: stages_pb2.AlignResponse = await call_stateless_stage(
            self.client,
            self.failover,
            lambda stub: stub.Align,
            request,
            request_id,
            stage_timeout(self.timeout_seconds, time_remaining),
        )
        return reply


__all__ = ["AlignerStage"]
