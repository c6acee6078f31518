"""WATCHDOG=1 is fed only while the loop thread makes progress; a crashed loop stops the daemon."""
import asyncio
import socket
from types import SimpleNamespace

from sitsd.config import load_config
from sitsd.daemon import Daemon
from sitsd.notify import Notifier

from ..conftest import EXAMPLE_CONFIG


def _count_watchdogs(sock) -> int:
    n = 0
    while True:
        try:
            n += sock.recv(4096) == b"WATCHDOG=1"
        except BlockingIOError:
            return n


async def _run(daemon, seconds, beat=False):
    async def progress():
        while True:
            daemon.counters.heartbeat += 1
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(daemon._housekeeping())]
    if beat:
        tasks.append(asyncio.create_task(progress()))
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_watchdog_only_while_the_loop_progresses(tmp_path):
    path = str(tmp_path / "n.sock")
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(path)
    manager.setblocking(False)
    daemon = Daemon(load_config(EXAMPLE_CONFIG), notifier=Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"}))
    daemon.loop = SimpleNamespace(crashed=None)
    daemon._stop = asyncio.Event()

    async def scenario():
        await _run(daemon, 0.6, beat=True)
        moving = _count_watchdogs(manager)
        await _run(daemon, 0.6, beat=False)  # the loop thread is stuck: heartbeat frozen
        stuck = _count_watchdogs(manager)
        return moving, stuck

    moving, stuck = asyncio.run(scenario())
    assert moving >= 5  # every 50 ms (half of WATCHDOG_USEC) while beating
    assert stuck <= 1  # at most one ping for the last beat seen, then silence so systemd restarts us
    manager.close()


def test_crashed_loop_stops_the_daemon_with_an_error_code():
    daemon = Daemon(load_config(EXAMPLE_CONFIG), notifier=Notifier({}))
    daemon.loop = SimpleNamespace(crashed=RuntimeError("boom"))

    async def scenario():
        daemon._stop = asyncio.Event()
        await asyncio.wait_for(daemon._housekeeping(), 2)
        return daemon._stop.is_set()

    assert asyncio.run(scenario())
    assert daemon.exit_code == 70
