"""The aligner's batcher on its own: stopping it never leaves a caller waiting forever, whether
its utterance is still queued, taken into a batch being collected, or in a forward pass."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from aligner_service.batcher import Batcher
from tts_common.compute_thread import ComputeThread


def test_stop_cancels_every_caller_it_holds() -> None:
    released = threading.Event()

    def run_batch(items: Sequence[str]) -> list[int]:
        if "slow" in items:
            released.wait(5)
        return [len(item) for item in items]

    async def main() -> None:
        compute = ComputeThread("test-batcher")
        try:
            # wait_s long: the batch holding "collected" waits for others to share it.
            batcher = Batcher(run_batch, compute, max_batch=4, wait_s=30.0, max_waiting=8)
            batcher.start()
            collected = asyncio.create_task(batcher.submit("collected"))
            await asyncio.sleep(0.1)
            assert batcher.waiting == 0  # taken off the queue, in the batch being collected
            await batcher.stop()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(collected, 2)

            batcher = Batcher(run_batch, compute, max_batch=1, wait_s=0.0, max_waiting=8)
            batcher.start()
            running = asyncio.create_task(batcher.submit("slow"))
            queued = asyncio.create_task(batcher.submit("queued"))
            await asyncio.sleep(0.1)
            assert batcher.running == 1 and batcher.waiting == 1
            await batcher.stop()
            released.set()
            for caller in (running, queued):
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(caller, 2)
        finally:
            released.set()
            await asyncio.to_thread(compute.shutdown)

    asyncio.run(main())
