"""`sitsctl top`: a live view of a running sitsd, built from its control socket's `status` answer.

Rates come from the difference between successive answers. On a terminal each refresh redraws
the screen in place (ANSI clear); otherwise each refresh is printed as a block of its own.
"""
from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from . import control
from .errors import ControlError

CLEAR = "\x1b[H\x1b[2J"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


def _ms(us: float) -> str:
    return f"{us / 1000:.2f} ms"


def _clock(t_ns: int | None) -> str:
    if not t_ns:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(t_ns / 1e9))


def _rate(now: dict, prev: dict | None, dt: float, key: str) -> str:
    if prev is None or dt <= 0:
        return "-"
    return f"{(now['counters'][key] - prev['counters'][key]) / dt:.1f}/s"


def _link_line(link: dict | None) -> str:
    """The PLC session: up or down (for how long), losses, reconnects, commands not sent, the frame watchdog."""
    if not link:
        return "  link      -"
    state = "up" if link.get("connected") else (f"DOWN {link['down_s']} s" if link.get("down_s") is not None
                                                 else "DOWN")
    text = (f"  link      {state}  losses {link.get('losses', 0)}  reconnects {link.get('reconnects', 0)}  "
            f"not sent {link.get('commands_not_sent', 0)}  frame age {link.get('frame_age_ms', 0)} ms"
            f"/{link.get('frame_timeout_ms', 0)} ms")
    if link.get("frames_stalled_s") is not None:
        text += f"  FRAMES STALLED {link['frames_stalled_s']} s"
    if link.get("last_loss") and not link.get("connected"):
        text += f"  ({link['last_loss']})"
    return text


def _certified(value: bool | None) -> str:
    if value is None:
        return ""
    return "  session key certified by the TPM" if value else "  session key NOT certified (swapped since start)"


def render(status: dict, prev: dict | None = None, dt: float = 0.0) -> str:
    """One screen of text for a status answer (and the previous one, for rates)."""
    c, lat = status["counters"], status["latency_us"]
    lines = [
        f"sitsd {status.get('line', '')}: {status['state']}, up {status['uptime_s']} s    "
        f"{time.strftime('%H:%M:%S')}",
        f"  model {str(status.get('model_sha256') or '')[:16]}  signer {status.get('signer')} "
        f"(key {str(status.get('key_id') or '')[:16]})  transport {status.get('transport')} "
        f"(rx stamps {status.get('rx_stamp_source')})",
        f"  PLC {status.get('plc')}" + (f"  ptp {status['ptp']}" if status.get("ptp") else ""),
        _link_line(status.get("plc_link")) + _certified(status.get("session_certified")),
        "",
        f"  frames    {c['frames']:>10}  {_rate(status, prev, dt, 'frames'):>10}",
        f"  commands  {c['commands']:>10}  {_rate(status, prev, dt, 'commands'):>10}",
        f"  dropped   {c['dropped']:>10}  (timestamp {c.get('dropped_timestamp', 0)}, constraint "
        f"{c.get('dropped_constraint', 0)}, lost in transit {c.get('lost', 0)}, malformed {c.get('malformed', 0)})",
        f"  fail-safe {c['failsafe']:>10}  (deadline missed {c.get('deadline_missed', 0)}, expired "
        f"{c.get('expired', 0)}, write errors {c.get('write_errors', 0)}, sign errors {c.get('sign_errors', 0)})",
        "",
        f"  latency   p50 {_ms(lat['p50'])}  p99 {_ms(lat['p99'])}  max {_ms(lat.get('max', 0.0))}",
        "",
        f"  {'stage':<16}{'p50 us':>10}{'p99 us':>10}{'max us':>10}",
    ]
    for name, s in status.get("stages_us", {}).items():
        lines.append(f"  {name:<16}{s['p50']:>10.1f}{s['p99']:>10.1f}{s.get('max', 0.0):>10.1f}")
    pr = status.get("proofs")
    if pr:
        lines += ["", f"  proofs    {pr['proved']:>10}  proved  (offered {pr['offered']}, accepted {pr['accepted']}, "
                  f"dropped {pr['dropped']}, failed {pr['failed']}, queue {pr['queue_depth']}/{pr['queue_max']}, "
                  f"in flight {pr['in_flight']})"]
    alerts = status.get("alerts") or {}
    lines += ["", "  alerts    " + (", ".join(f"{k} {v}" for k, v in sorted(alerts.items())) or "none")]
    for a in status.get("recent_alerts") or []:
        lines.append(f"    {_clock(a.get('t_ns'))}  {a.get('kind')}: {a.get('reason')}")
    events = status.get("plc_events") or {}
    lines += ["  PLC events " + (", ".join(f"{k} x{v}" for k, v in sorted(events.items())) or "none")]
    for e in status.get("recent_plc_events") or []:
        lines.append(f"    {_clock(e.get('t_ns'))}  [{e.get('severity')}] {e.get('code')} {e.get('component') or ''}"
                     f" {e.get('text') or ''}".rstrip())
    return "\n".join(lines) + "\n"


def run_top(socket_path: str | os.PathLike, interval_s: float = 1.0, iterations: int | None = None,
            out: TextIO = sys.stdout, err: TextIO | None = None) -> int:
    """Refresh every `interval_s` until Ctrl-C (or `iterations` refreshes). Returns an exit code:
    0, or 2 when the daemon cannot be reached at the start. A daemon that goes away later is shown
    as unreachable and retried."""
    err = err if err is not None else sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)())
    try:
        status = control.request(socket_path, "status")
    except ControlError as exc:
        print(f"sitsctl top: {exc}", file=err)
        return 2
    prev, prev_t, done, problem = None, 0.0, 0, ""
    if tty:
        out.write(HIDE_CURSOR)
    try:
        while True:
            now_t = time.monotonic()
            if status is not None:
                text = render(status, prev, now_t - prev_t)
                prev, prev_t = status, now_t
            else:
                text = f"sitsd unreachable at {socket_path}: {problem}\n  retrying every {interval_s:g} s\n"
                prev = None
            out.write((CLEAR if tty else ("\n" if done else "")) + text)
            out.flush()
            done += 1
            if iterations is not None and done >= iterations:
                return 0
            time.sleep(max(0.0, interval_s - (time.monotonic() - now_t)))
            try:
                status, problem = control.request(socket_path, "status"), ""
            except ControlError as exc:
                status, problem = None, str(exc)
    except KeyboardInterrupt:
        out.write("\n")
        return 0
    finally:
        if tty:
            out.write(SHOW_CURSOR)
            out.flush()
