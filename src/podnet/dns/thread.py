"""An event loop on a thread of its own, for the DNS listeners.

The agent's loop programs policy, services and CNI; a pod flooding the DNS must not
delay them. So the listeners (and the forwarder) run on their own loop in their own
thread: the agent's loop only feeds the zone index (``podnet.dns.sync``, under the
handler's lock). The GIL is still shared, but the DNS thread's work is bounded per
client (``podnet.dns.ratelimit``) and it gives the GIL up at each socket call.

``run_in_thread`` awaits a coroutine function run there: its exception is raised in
the caller, and cancelling the caller cancels it and waits (at most ``STOP_TIMEOUT``)
for it to clean up, so its sockets are closed when the caller is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

STOP_TIMEOUT = 5.0

Body = Callable[[], Coroutine[Any, Any, None]]


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


class _Runner:
    """The thread: a new loop running ``body`` until it ends or is cancelled."""

    def __init__(self, body: Body, home: asyncio.AbstractEventLoop) -> None:
        self.body = body
        self.home = home
        self.done: asyncio.Future[None] = home.create_future()
        self.started = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None

    def main(self) -> None:
        loop = asyncio.new_event_loop()
        error: BaseException | None = None
        try:
            self.loop, self.task = loop, loop.create_task(self.body())
            self.started.set()
            loop.run_until_complete(self.task)
        except asyncio.CancelledError:
            pass  # stopped by ``cancel``
        except BaseException as exc:  # handed to the caller, which decides
            error = exc
        finally:
            self.started.set()
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed
                self.home.call_soon_threadsafe(_settle, self.done, error)

    def cancel(self) -> None:
        self.started.wait(STOP_TIMEOUT)
        loop, task = self.loop, self.task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the thread's loop is closed: it ended
                loop.call_soon_threadsafe(task.cancel)


async def run_in_thread(body: Body, name: str) -> None:
    """Run ``body()`` on a new event loop in a new daemon thread called ``name`` until it
    ends; see the module docstring."""
    runner = _Runner(body, asyncio.get_running_loop())
    thread = threading.Thread(target=runner.main, name=name, daemon=True)
    thread.start()
    try:
        await asyncio.shield(runner.done)
    except asyncio.CancelledError:
        runner.cancel()
        await asyncio.wait({runner.done}, timeout=STOP_TIMEOUT)
        if runner.done.done():
            runner.done.exception()  # retrieved: the cancellation is what is reported
        raise
