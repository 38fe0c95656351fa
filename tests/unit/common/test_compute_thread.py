"""One compute thread per stage process: ComputeThread and one-off threads."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from tts_common.compute_thread import ComputeThread, call_in_fresh_thread, run_in_fresh_thread

REQUEST = contextvars.ContextVar("REQUEST", default="-")


def _whoami() -> tuple[threading.Thread, str]:
    return threading.current_thread(), REQUEST.get()


def test_compute_thread_runs_every_call_on_one_thread_with_the_callers_context() -> None:
    compute = ComputeThread("test-compute")

    async def main() -> list[tuple[threading.Thread, str]]:
        async def one(i: int) -> tuple[threading.Thread, str]:
            REQUEST.set(f"r{i}")
            return await compute.run(_whoami)

        return await asyncio.gather(*(one(i) for i in range(5)))

    try:
        results = asyncio.run(main())
        threads = {t for t, _ in results}
        assert len(threads) == 1 and threading.main_thread() not in threads
        assert [r for _, r in results] == [f"r{i}" for i in range(5)]

        async def failing() -> None:
            await compute.run(int, "not a number")

        with pytest.raises(ValueError):
            asyncio.run(failing())
    finally:
        compute.shutdown()


def test_fresh_threads_exit_after_their_call() -> None:
    async def main() -> tuple[threading.Thread, str]:
        REQUEST.set("load")
        return await run_in_fresh_thread(_whoami)

    thread, request = asyncio.run(main())
    assert request == "load" and thread is not threading.main_thread()
    thread.join(10)
    assert not thread.is_alive()

    thread, _ = call_in_fresh_thread(_whoami)
    assert not thread.is_alive() and thread is not threading.main_thread()
    with pytest.raises(ZeroDivisionError):
        call_in_fresh_thread(lambda: 1 / 0)

    async def failing() -> None:
        await run_in_fresh_thread(lambda: 1 / 0)

    with pytest.raises(ZeroDivisionError):
        asyncio.run(failing())
