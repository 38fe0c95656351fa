"""Which thread runs a stage's torch compute, and why it must be one thread per process on CPU.

torch's CPU kernels parallelise with OpenMP (GNU libgomp in the official wheels), and libgomp keeps
a pool of worker threads for EVERY thread that has ever run a parallel region, for as long as that
thread lives. Once the pooled threads of a process outnumber its CPUs, libgomp stops spinning
between parallel regions and parks/wakes its workers through the kernel instead. A talker decode
step runs ~1,500 parallel regions (one per linear, norm, attention ...), so with the model loaded
in one thread and stepped in another the step paid ~1,700 context switches and ran 25-40% slower
(measured: 2-core VM, 0.6B talker, batch 1: ~370 ms instead of ~280 ms per step).

The rule for every stage process, therefore:

* long-lived compute (the talker's engine loop, the decoder's batches, the speaker encoders) runs
  on ONE thread: the talker engine's own loop thread, or a :class:`ComputeThread` elsewhere;
* one-off compute that cannot run there (loading a checkpoint before that thread exists) runs in
  a thread that exits afterwards (:func:`run_in_fresh_thread`), taking its pool with it;
* the asyncio thread does no torch compute.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def adopt_torch_threads() -> None:
    """Give the calling thread torch's configured CPU thread count.

    ``torch.set_num_threads`` sets OpenMP's count for the calling thread only; a new thread
    starts from OpenMP's default (all CPUs), which oneDNN kernels would use as is.
    """
    import torch

    torch.set_num_threads(torch.get_num_threads())


class ComputeThread:
    """A single long-lived worker thread that runs a stage's torch work, one call at a time."""

    def __init__(self, name: str) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=adopt_torch_threads
        )

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` on the compute thread (context variables carried over,
        like ``asyncio.to_thread``: the request id reaches the logs)."""
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def shutdown(self) -> None:
        """Finish queued calls and stop the thread."""
        self._executor.shutdown(wait=True)


def call_in_fresh_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call ``fn(*args, **kwargs)`` in a new thread and wait for that thread to exit (see the
    module docstring: its OpenMP pool goes with it); context variables carried over."""
    ctx = contextvars.copy_context()
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            adopt_torch_threads()
            outcome["result"] = ctx.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"oneoff-{getattr(fn, '__name__', 'call')}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]


async def run_in_fresh_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await :func:`call_in_fresh_thread` (the waiting, not the work, takes an executor thread)."""
    return await asyncio.to_thread(call_in_fresh_thread, fn, *args, **kwargs)
