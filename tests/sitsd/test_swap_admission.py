"""Updates and rollbacks on the control socket run on threads of their own, at most MAX_SWAP_REQUESTS at once:
more are refused at once, and asyncio's default pool (the daemon's housekeeping, which feeds the watchdog, runs
its health check there) stays free however many clients send updates. The hot swap behind the handlers is a
stand-in whose update blocks until released (a model proof that takes minutes)."""
import asyncio
import threading
from types import SimpleNamespace

import structlog

from sitsd.hotswap import MAX_SWAP_REQUESTS, control_handlers


class SlowSwap:
    def __init__(self):
        self.release, self.started, self.threads = threading.Event(), 0, set()

    def update_module(self, path, name=None, sha256=None):
        self.started += 1
        self.threads.add(threading.current_thread().name)
        self.release.wait(30)
        return {"component": "module:pre", "name": str(path)}


def test_updates_past_the_cap_are_refused_and_the_default_pool_stays_free():
    swap = SlowSwap()
    alerts = []
    daemon = SimpleNamespace(hotswap=swap, log=structlog.get_logger(), measurements=None,
                             _alert=lambda kind, text: alerts.append((kind, text)))
    update = control_handlers(daemon)["update"]

    async def main():
        running = [asyncio.create_task(update({"module": f"m{i}.wat"})) for i in range(MAX_SWAP_REQUESTS)]
        await asyncio.sleep(0.2)
        extra = await asyncio.wait_for(update({"module": "late.wat"}), 5)  # answered at once, not queued
        # the default executor (housekeeping's to_thread) is not blocked behind the updates
        pong = await asyncio.wait_for(asyncio.to_thread(lambda: "pong"), 5)
        swap.release.set()
        done = await asyncio.gather(*running)
        return extra, pong, done

    extra, pong, done = asyncio.run(main())
    assert not extra["ok"] and f"{MAX_SWAP_REQUESTS} updates or rollbacks are in progress" in extra["error"], extra
    assert pong == "pong"
    assert all(d.get("updated") for d in done), done
    assert swap.started == MAX_SWAP_REQUESTS  # the refused one never reached the hot swap
    assert swap.threads and all(name.startswith("sitsd-swap") for name in swap.threads), swap.threads
    assert [k for k, _ in alerts] == ["update_refused"]
