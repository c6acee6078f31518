"""sitsd: the daemon's entry point (`sitsd --config FILE`)."""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from .cli import parse_overrides
from .errors import SitsError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="sitsd", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="sits2026 daemon: reads sensor frames from a PLC, gates them, runs the model, signs each "
        "command and writes it to the PLC. Runs under systemd (Type=notify) or in a terminal.",
        epilog="Logs are JSON lines on stderr. `sitsctl status --config FILE` reads the running counters.\n"
        "Point it at a real PLC with plc.endpoint / plc.command_node / transport.url in the config, and at a real\n"
        "TPM with attestation.tcti: device:/dev/tpmrm0.")
    ap.add_argument("--config", type=Path, required=True, help="YAML config (see examples/rolling-mill.yaml)")
    ap.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="override a config field, e.g. --set attestation.mode=software (repeatable)")
    ap.add_argument("--check", action="store_true", help="validate the config and exit")
    ap.add_argument("--syslog-prefix", action="store_true",
                    help="prefix log lines with <N> for journald (the unit file sets this)")
    ap.add_argument("--log-target", choices=("auto", "journal", "stderr"), default="auto",
                    help="journal: structured entries to journald's native socket (PRIORITY, MESSAGE and one "
                    "SITS_* field per event field); stderr: JSON lines; auto (default): journal when "
                    "systemd connected stderr to the journal (JOURNAL_STREAM), else stderr")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import hashlib

    from .config import load_config, read_config_bytes
    from .daemon import Daemon
    from .log import configure

    try:
        data = read_config_bytes(args.config)  # read once: parsed, and measured into PCR 23, from these bytes
        cfg = load_config(args.config, parse_overrides(args.set), data=data)  # --set applies to reloads as well
    except SitsError as exc:
        print(f"sitsd: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: OK")
        return 0
    from .log import journal_available

    journal = args.log_target == "journal" or (args.log_target == "auto" and journal_available())
    configure(cfg.logging.level, sys.stderr, syslog_prefix=args.syslog_prefix, journal=journal)
    overrides = parse_overrides(args.set)
    daemon = Daemon(cfg, config_path=args.config, config_overrides=overrides,
                    config_sha256=hashlib.sha256(data).hexdigest())

    async def run() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.request_stop)
        # SIGHUP re-reads the config and applies what can change live (systemctl reload sitsd)
        loop.add_signal_handler(signal.SIGHUP, daemon.reload_in_background)
        return await daemon.serve()

    return asyncio.run(run())


if __name__ == "__main__":
    raise SystemExit(main())
