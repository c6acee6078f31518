"""The frame receive under GIL contention: the kernel's receive timeout vs Python's socket timeout.

    python bench/receive_gil.py [--frames N] [--rounds R] [--json]

A publisher process sends UADP frames at 1 kHz over loopback multicast; the loop thread receives them with
`plc.udp.UdpFrameSource` (SCHED_FIFO 40 where allowed), switching the GIL interval as the daemon's loop does
(`sitsd.pipeline.GilPriority`: 0.2 ms while it waits, 5 ms once it has a frame), while a Python thread in the
same process always wants the GIL (what a hot swap's preparation does for a while). Measured per frame: from
the kernel's receive stamp (SO_TIMESTAMPING, software) to the receive returning in Python.

- `kernel_timeout` (what the sources do): a blocking socket with SO_RCVTIMEO; one system call, one GIL
  release per receive.
- `socket_timeout` (the baseline): Python's `settimeout`, which polls and then receives, releasing the
  GIL twice; a thread that takes it in between holds the loop up.

The two alternate in R rounds of N frames each, so both see the same minutes of this machine. The last line
with --json is one JSON object: per mode p50/p90/p99/p99.9/max in µs over all rounds, the per-round p99s,
and the p99 ratio socket_timeout / kernel_timeout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plc.frame import RxStampSource  # noqa: E402
from plc.uadp import FixedLayout  # noqa: E402
from plc.udp import UdpFrameSource, private_multicast_url  # noqa: E402
from sitsd.pipeline import GilPriority  # noqa: E402

SENDER = """
import sys, time
sys.path.insert(0, {root!r})
from plc.uadp import FixedLayout, UadpMessage
from plc.udp import UdpPublisher
layout, pub = FixedLayout(6), UdpPublisher({url!r}, "127.0.0.1")
t = time.perf_counter() + 0.3
for seq in range(1, {n} + 1):
    t += 0.001
    while time.perf_counter() < t:
        time.sleep(0.0002)
    pub.send(layout.encode(UadpMessage(7, 1, 1, seq, seq, time.time_ns(), (1.0, 2.0, 3.0, 4.0, 5.0, 6.0))))
"""


CPUS = sorted(os.sched_getaffinity(0))
LOOP_CPU, OTHER_CPUS = (CPUS[-1], set(CPUS[:-1])) if len(CPUS) > 1 else (None, set(CPUS))


def _normal_policy() -> None:
    """SCHED_OTHER and the CPUs other than the loop's, for the calling thread: threads and children inherit the
    loop thread's SCHED_FIFO, which a thread that never sleeps must not have (real-time throttling stops it
    50 ms a second, and the box with it). Apart, the loop and the hungry thread do not share a CPU by chance
    in some rounds and not in others (as in sitsd, whose loop thread can have its own core: `runtime.loop_cpu`)."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    os.sched_setaffinity(0, OTHER_CPUS)


def one_round(mode: str, frames: int, warmup: int = 100) -> np.ndarray:
    url = private_multicast_url()  # rounds do not hear each other
    source = UdpFrameSource(url, FixedLayout(6), "127.0.0.1", publisher_id=7)
    if mode == "socket_timeout":  # the baseline: Python's own timeout (poll, then receive)
        def flags(timeout_s: float, sock=source._sock) -> int:
            sock.settimeout(timeout_s)
            return 0
        source.receive_flags = flags
    gil = GilPriority()
    source.after_wait = gil.running
    sender = subprocess.Popen([sys.executable, "-c", SENDER.format(root=str(Path(__file__).resolve().parents[1]),
                                                                   url=url, n=frames + warmup)],
                              preexec_fn=_normal_policy)  # started before the hungry thread: no other threads
    stop = threading.Event()

    def hungry() -> None:  # always wants the GIL; a normal thread, as sitsd's preparing one is
        _normal_policy()
        x = 0
        while not stop.is_set():
            x += 1

    threading.Thread(target=hungry, name="gil-hungry", daemon=True).start()
    lat: list[int] = []
    got = 0
    try:
        deadline = time.monotonic() + 30 + frames / 500
        while got < frames + warmup and time.monotonic() < deadline:
            gil.waiting()
            frame = source.receive(0.05)
            now = time.time_ns()
            if frame is None:
                if sender.poll() is not None:
                    break
                continue
            got += 1
            if got > warmup and frame.rx_stamp_source == RxStampSource.SOFTWARE:
                lat.append(now - frame.rx_timestamp_ns)
    finally:
        stop.set()
        gil.restore()
        sender.wait(30)
        source.close()
    return np.array(lat, dtype=np.float64) / 1e3


def summary(a: np.ndarray) -> dict:
    q = np.percentile(a, [50, 90, 99, 99.9]) if len(a) else [float("nan")] * 4
    return {"frames": int(len(a)), "p50": round(float(q[0]), 1), "p90": round(float(q[1]), 1),
            "p99": round(float(q[2]), 1), "p99_9": round(float(q[3]), 1),
            "max": round(float(a.max()), 1) if len(a) else float("nan")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--frames", type=int, default=5000, help="frames per round and mode (default 5000: 5 s at 1 kHz)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each runs both modes (default 3)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(40))  # the loop thread's policy in sitsd
        policy = "SCHED_FIFO 40"
    except (OSError, AttributeError):
        policy = "SCHED_OTHER (not root)"
    if LOOP_CPU is not None:
        os.sched_setaffinity(0, {LOOP_CPU})
        policy += f" on CPU {LOOP_CPU}, the others on CPU {','.join(map(str, sorted(OTHER_CPUS)))}"
    modes = ("kernel_timeout", "socket_timeout")
    runs: dict[str, list[np.ndarray]] = {m: [] for m in modes}
    print(f"receive under GIL contention: {args.rounds} rounds x {args.frames} frames at 1 kHz per mode, "
          f"loop thread {policy}", flush=True)
    for r in range(args.rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            a = one_round(m, args.frames)
            runs[m].append(a)
            s = summary(a)
            print(f"  round {r + 1} {m:15s} p50 {s['p50']:7.1f}  p90 {s['p90']:7.1f}  p99 {s['p99']:7.1f}  "
                  f"p99.9 {s['p99_9']:8.1f}  max {s['max']:8.1f} us  ({s['frames']} frames)", flush=True)
    out = {m: summary(np.concatenate(runs[m])) for m in modes}
    for m in modes:
        out[m]["round_p99"] = [summary(a)["p99"] for a in runs[m]]
    out["p99_ratio_socket_over_kernel"] = round(out["socket_timeout"]["p99"] / out["kernel_timeout"]["p99"], 2)
    out["loop_policy"] = policy
    print(f"all rounds: kernel timeout p99 {out['kernel_timeout']['p99']} us, socket timeout p99 "
          f"{out['socket_timeout']['p99']} us (x{out['p99_ratio_socket_over_kernel']})")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
