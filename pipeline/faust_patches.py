"""Small, guarded patches to faust-streaming, applied once per process by `create_app`.

Each patch changes how Faust does something, never what it does, and checks that the code it wraps
still looks as expected (falling back to Faust's own path otherwise).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from mode.services import WaitResults

_PATCHED = "_switchboard_patched"


def apply() -> None:
    _patch_fetch_wait()
    _patch_delivery_wait()


def _patch_fetch_wait() -> None:
    """Make the worker consumer's fetch wait configurable.

    faust-streaming hard-codes `fetch_max_wait_ms=1500` for the worker consumer. On a broker that
    does not answer fetches early (Tansu) every hop then waits that long. The consumer reads the
    value at start, so setting it on the freshly built consumer is enough.
    """
    if getattr(AIOKafkaConsumerThread, _PATCHED, False):
        return
    original = AIOKafkaConsumerThread._create_worker_consumer

    def create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        wait = getattr(self.app, "switchboard_fetch_max_wait_ms", None)
        if wait is not None:
            consumer._fetch_max_wait_ms = wait
        return consumer

    AIOKafkaConsumerThread._create_worker_consumer = create_worker_consumer  # type: ignore[method-assign]
    setattr(AIOKafkaConsumerThread, _PATCHED, True)


def _patch_delivery_wait() -> None:
    """Hand each fetched record to its streams without four tasks per record.

    Faust's consumer delivers every record with `wait_first(deliver(record), suspend_flow.wait())`,
    which wraps both, plus its own stopped/crashed events, in tasks and an `asyncio.wait`: about a
    tenth of a worker's CPU at a few thousand records/s. Delivery almost always finishes at once (a
    `put_nowait` into the stream's buffer), so the delivery coroutine is stepped directly; only
    when it has to wait (a full buffer) does the rest go through Faust's `wait_first`, where a
    rebalance (`suspend_flow`) can still cut it short.
    """
    if getattr(Consumer, _PATCHED, False):
        return
    original = Consumer.wait_first

    async def wait_first(self: Any, *coros: Any, timeout: Any = None) -> WaitResults:
        if len(coros) == 2 and timeout is None and _is_suspend_wait(coros[1], self) and not self.should_stop:
            delivery = coros[0]
            if asyncio.iscoroutine(delivery) and not self.suspend_flow.is_set():
                try:
                    pending = delivery.send(None)
                except StopIteration as done:
                    coros[1].close()  # never started: nothing to wait for
                    return WaitResults([delivery], [done.value], False)
                return await original(self, _resume(delivery, pending), coros[1])
        return await original(self, *coros, timeout=timeout)

    Consumer.wait_first = wait_first  # type: ignore[method-assign]
    setattr(Consumer, _PATCHED, True)


def _is_suspend_wait(coro: Any, consumer: Any) -> bool:
    """True for the not yet started `consumer.suspend_flow.wait()` coroutine."""
    frame = getattr(coro, "cr_frame", None)
    return frame is not None and frame.f_locals.get("self") is consumer.suspend_flow


async def _resume(coro: Coroutine[Any, Any, Any], pending: Any) -> Any:
    """Finish a coroutine that was stepped once outside a task and is waiting on `pending`."""
    return await _Resumed(coro, pending)


class _Resumed:
    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        # What `yield from` would do: pass what the coroutine waits on up to the task, and the
        # task's answer (a value or an exception such as a cancellation) back down.
        coro, waiting = self._coro, self._pending
        while True:
            try:
                answer = yield waiting
            except BaseException as exc:  # forwarded to the coroutine, not handled here
                try:
                    waiting = coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                waiting = coro.send(answer)
            except StopIteration as done:
                return done.value
