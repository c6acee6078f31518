"""sitsctl: run the demo, ask a running sitsd for its status, check a config, run the PLC simulator."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

from .errors import SitsError

EPILOG = """examples:
  sitsctl demo --seconds 10            closed loop against the built-in PLC simulator
  sitsctl demo --seconds 10 --json     ... and a JSON summary as the last line of stdout
  sitsctl status --config rolling-mill.yaml
  sitsctl top --config rolling-mill.yaml        live view (Ctrl-C to leave)
  sitsctl check-config --config rolling-mill.yaml
  sitsctl check --config rolling-mill.yaml --json   prove constraints and model bounds
  sitsctl compile model.onnx --quantization fp8-adaptive --calibration data.npy --output artifact/
  sitsctl pki init --config rolling-mill.yaml   create this device's OPC UA certificate
  sitsctl deploy --config rolling-mill.yaml --attestation-mode tpm2 --verify-on-boot true
  sitsctl update --module new_filter.wat --daemon-config rolling-mill.yaml   hot swap between two frames
  sitsctl rollback --module pre_filter --daemon-config rolling-mill.yaml
  sitsctl diagnose --config rolling-mill.yaml --format png --output cause.png   ranked root cause
  sitsctl audit verify /var/lib/sitsd/audit     the hash chain; exit 1 names the first bad record
  sitsctl audit verify /var/lib/sitsd/audit --tpm   ... and the TPM anchor counter: a cut of the newest records
  sitsctl measurements verify /var/lib/sitsd/audit   the PCR 23 log and its archives; exit 1 names file and event
  sitsctl verify-proof proof.json --vk vk.json --public public.json   exit 0 only for a valid proof
  sitsctl sign --authority-key authority.key.pem pre_filter.wat rolling-mill.yaml   writes FILE.sig (offline)
  sitsctl verify-signature --authority-pub authority.pub.pem pre_filter.wat
  sitsctl plcsim --trust-key /var/lib/sitsd/audit/signer.pub.pem
  --tcti STRING (or SITS_TCTI) works with every command: the TPM to use instead of attestation.tcti
"""


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE, e.g. --set attestation.mode=software")
        key, value = item.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def _cmd_demo(args) -> int:
    from .demo import human_summary, run_demo

    result = run_demo(seconds=args.seconds, config_path=args.config, force_software=args.software,
                      seed=args.seed, rate_hz=args.rate, transport=args.transport, security=args.security,
                      field_encoding=args.field_encoding, profile=args.profile, signing=args.signing,
                      proof_every=args.proofs, compiled=not args.onnx, certify_session=args.certify_session,
                      metrics=args.metrics, accept_models=tuple(args.accept_model))
    print(human_summary(result))
    if args.json:
        print(json.dumps(result))
    return 0


def _socket_path(args) -> Path:
    if args.socket:
        return Path(args.socket)
    from .config import load_config

    return Path(load_config(args.config, parse_overrides(args.set)).control.socket)


def _print_audit_durability(head: dict | None, durable: dict | None) -> None:
    """`sitsctl status`: the audit head, and what of it is on disk under audit.fsync (daemon status audit_durable)."""
    if not head:
        return
    print(f"  audit   head: {head['records']} records (seq {head.get('seq')}), hash {str(head['hash'])[:16]}…")
    if not durable:
        return
    if durable.get("at_ns"):
        import time

        age_s = max(0.0, (time.time_ns() - durable["at_ns"]) / 1e9)
        on_disk = (f"{durable['records']} records (seq {durable['seq']}), hash {str(durable['hash'])[:16]}…, "
                   f"fsynced {age_s:.1f} s ago")
    else:
        on_disk = "nothing fsynced yet by this process"
    print(f"          on disk: {on_disk}; not yet on disk: {durable['not_durable']} records "
          f"(audit.fsync {durable['policy']}: {durable['promise']})")


def _cmd_status(args) -> int:
    from .control import request

    answer = request(_socket_path(args), "status")
    answer.pop("ok", None)
    if args.json:
        print(json.dumps(answer))
        return 0
    c, lat = answer["counters"], answer["latency_us"]
    print(f"sitsd {answer['line']}: {answer['state']}, up {answer['uptime_s']} s")
    print(f"  model   {answer['model']} (sha256 {answer['model_sha256']})")
    per = answer.get("persistence") or {}
    if answer.get("stages_source"):
        print(f"  stages  from {answer['stages_source']}; a restart loads "
              + ("the persisted updates" if per.get("restart_loads") == "persisted" else "the config's versions")
              + (f" ({per['inactive_reason']})" if per.get("inactive_reason") else "")
              + (f"; last persistence error: {per['last_error']}" if per.get("last_error") else ""))
    rt = answer.get("model_runtime") or {}
    if rt:
        print(f"  runtime {rt.get('provider')} (policy {rt.get('policy')})"
              + "".join(f"; {n}" for n in (rt.get("notes") or [])[:2]))
    tpm, certified = answer.get("tpm"), answer.get("session_certified")
    print(f"  signer  {answer['signer']} (key id {answer['key_id']})"
          + ("" if certified is None else "; session key certified by the TPM" if certified
             else "; session key NOT certified")
          + ("" if not tpm else f"; TPM NOT ANSWERING ({tpm['last_error']})" if not tpm["reachable"]
             else "; TPM answers, session key NOT BOUND (TPM reset: re-measuring; nothing is signed)"
             if tpm.get("bound") is False else "; TPM answers"
             + (f" (reset {tpm['resets']}x, re-measured)" if tpm.get("resets") else "")))
    print(f"  PLC     {answer['plc']}")
    link, mlog = answer.get("plc_link") or {}, answer.get("measurement_log")
    if mlog and answer.get("signing_mode") == "tpm-session":  # the credential re-written after each measurement
        print(f"  session re-binds {link.get('rebinds', 0)} (failed {link.get('rebind_failures', 0)}); measurement "
              f"log {mlog['events']} events (PCR {mlog['pcr']}), compacted {link.get('compactions', 0)}x"
              + (f" at {mlog['compact_at']}" if mlog.get("compact_at") else "")
              + (f"; COMPACTION FAILED ({mlog['compaction_error']})" if mlog.get("compaction_error") else ""))
    if answer.get("session_credential"):
        print(f"  session credential {answer['session_credential']}"
              + ("; the PLC HOLDS A STALE CREDENTIAL (re-binding)" if link.get("credential_stale") else ""))
    print(f"  frames {c['frames']}  commands {c['commands']}  dropped {c['dropped']}  fail-safe {c['failsafe']}  "
          f"deadline missed {c['deadline_missed']}  expired {c['expired']}  write errors {c['write_errors']}")
    print(f"  latency p50 {lat['p50'] / 1000:.2f} ms  p99 {lat['p99'] / 1000:.2f} ms  max {lat['max'] / 1000:.2f} ms")
    pr = answer.get("proofs")
    if pr:
        print(f"  proofs  {pr['policy']}{' n=' + str(pr['n']) if pr['policy'] == 'one_in_n' else ''}: offered "
              f"{pr['offered']}  accepted {pr['accepted']}  dropped (queue full) {pr['dropped']}  proved "
              f"{pr['proved']}  failed {pr['failed']}  queue {pr['queue_depth']}/{pr['queue_max']}  in flight "
              f"{pr['in_flight']}  workers {len(pr['worker_pids'])}"
              f"{'  STALLED (alert prover)' if pr.get('stalled') else ''}"
              f"{'  stalls ' + str(pr['stalls']) if pr.get('stalls') else ''}")
    _print_audit_durability(answer.get("audit_head"), answer.get("audit_durable"))
    an = answer.get("audit_anchor")
    if an:
        print(f"  audit   anchor {an['nv_index']}: TPM counter {an['counter']}, newest anchor {an['last_anchor']}, "
              f"start check {an['start_check']}, errors {an['errors']}")
    if answer["alerts"]:
        print("  alerts  " + ", ".join(f"{k} {v}" for k, v in answer["alerts"].items()))
    return 0


def _cmd_audit(args) -> int:
    from .audit import AuditError, audit_files, verify_chain, verify_directory
    from .audit import segment_header as _audit_header

    target = args.path or Path(load_audit_dir(args))
    if not Path(target).exists():
        print(f"sitsctl audit: {target} does not exist (give the audit directory, audit.directory in the config, "
              "or one segment file)", file=sys.stderr)
        return 2
    tpm = None
    if args.action == "verify" and args.tpm:
        # the TPM counter first, then the files: a running sitsd only adds anchors (each on disk before the counter
        # reaches it), so a counter read before the scan is never above an anchor the scan finds, unless deleted
        tpm = _read_anchor_counter(args, Path(target))
        if isinstance(tpm, int):
            return tpm
    files = audit_files(target)
    if not files:
        print(f"sitsctl audit: no audit files (commands-*.jsonl[.zst]) in {target}", file=sys.stderr)
        return 2
    if args.action == "verify":
        try:
            results = verify_directory(target) if Path(target).is_dir() else [(files[0], verify_chain(files[0]))]
        except AuditError as exc:
            print(f"{exc}", file=sys.stderr)
            return 1
        for i, (f, n) in enumerate(results):
            print(f"{f}: OK, {n} records")
            header = _audit_header(f) if i else None
            if header and header.get("previous_closed") is False:
                print(f"  note: {header.get('previous_file')} before it ended without a clean stop (crash, kill or "
                      "power loss: no close record)")
        first = _audit_header(files[0])
        if Path(target).is_dir() and first and first.get("previous_file"):
            print(f"segments up to {first['previous_file']} were removed by the retention policy (recorded in the log)")
        print(f"chain intact across {len(results)} segment(s), {sum(n for _, n in results)} records")
        return _audit_anchors(args, target, files, tpm)
    return _audit_show(args, files)


def _audit_show(args, files: list[Path]) -> int:
    """`sitsctl audit show`: the command records readably; --full adds model hash, input digest, proof reference and
    envelope. It is a reader: a line that is not shown (not a record, a record whose hash does not match, a cut-off
    last line, the point where a damaged compressed frame ends the segment) is named (file:line, byte offset, what
    is wrong) on stderr and skipped, an intact record that breaks the chain is shown and named, and reading goes on
    (exit 1 at the end). `sitsctl audit verify` is the check of the whole chain."""
    from .audit import iter_entries

    bad = 0
    for f in files:
        shown = []  # (line, record, damage): --last counts records and damaged lines alike
        for lineno, body, damage in iter_entries(f):
            if damage is not None or "type" not in body:
                shown.append((lineno, body if body is not None and "type" not in body else None, damage))
        named = hidden = 0  # a damaged zstd frame can garble thousands of lines: the first are named, then a count
        for lineno, r, damage in shown[-args.last:] if args.last else shown:
            if damage is not None:
                bad += 1
                what = "shown" if r is not None else "intact, a log record" if damage.kind == "chain" else "skipped"
                if named < SHOW_DAMAGED_LINES or damage.kind in ("frame", "unreadable"):
                    named += 1
                    print(f"{f}:{lineno}: {damage.reason} ({damage.where}); {what} (`sitsctl audit verify` checks "
                          "the chain)", file=sys.stderr)
                else:
                    hidden += 1
            if r is None:
                continue
            try:
                values = ", ".join(f"{v:.6g}" for v in r.get("values") or [])
            except (TypeError, ValueError):
                values = repr(r.get("values"))
            print(f"seq {str(r.get('seq')):>8}  frame {str(r.get('frame_seq')):>6}  "
                  f"{str(r.get('outcome', 'acknowledged')):<12} "
                  f"{'FAILSAFE ' if r.get('failsafe') else ''}[{values}]  sent {r.get('sent_ns')}")
            if args.full:
                proof = r.get("proof")
                ref = (f"{proof.get('id')} ({proof.get('proof')})" if isinstance(proof, dict) else
                       "none" if proof is None else str(proof))
                extra = "".join(f"  {k} {r[k]}" for k in ("ack_ns", "reason", "error") if r.get(k) is not None)
                print(f"    {f.name}:{lineno}{extra}")
                print(f"    model {r.get('model_sha256')}  input {r.get('input_sha256')}")
                print(f"    proof {ref}")
                print(f"    envelope {r.get('envelope')}")
        if hidden:
            print(f"{f}: {hidden} more damaged line(s) not named here; skipped", file=sys.stderr)
    return 1 if bad else 0


SHOW_DAMAGED_LINES = 20  # per segment, `sitsctl audit show`


def _read_anchor_counter(args, target: Path):
    """`audit verify --tpm`, before the log is listed: (counter, nv_index, value), or an exit status after an error
    was printed."""
    if not target.is_dir():
        print("sitsctl audit verify --tpm: give the audit directory (the newest anchor may be in any segment)",
              file=sys.stderr)
        return 2
    from .audit import AnchorScanError, anchor_summary, audit_files
    from .audit_anchor import DEFAULT_NV_INDEX, AnchorTpmError, TpmNvCounter
    from .config import CLI_OVERRIDES

    tcti, nv_index = CLI_OVERRIDES.get("attestation.tcti"), args.nv_index
    if tcti is None or nv_index is None:
        if args.config.exists() or args.set:  # the daemon's config names the TPM and the index
            cfg = __import__("sitsd.config").config.load_config(args.config, parse_overrides(args.set))
            tcti = tcti or cfg.attestation.tcti
            nv_index = nv_index if nv_index is not None else cfg.audit.anchor_nv_index
    if nv_index is None:  # the index the log's newest anchor names (only which index: the comparison reads again)
        try:
            newest = anchor_summary(audit_files(target), newest_only=True)["newest"]
            nv_index = int(str(newest["nv_index"]), 0) if newest and newest.get("nv_index") else DEFAULT_NV_INDEX
        except (AnchorScanError, ValueError):
            nv_index = DEFAULT_NV_INDEX
    if not tcti:
        print("sitsctl audit verify --tpm: which TPM? give --tcti STRING (or SITS_TCTI), or --config with "
              "attestation.tcti", file=sys.stderr)
        return 2
    counter = None
    try:
        counter = TpmNvCounter.own(tcti, nv_index)
        value = counter.read()
    except (AnchorTpmError, ValueError) as exc:
        print(f"sitsctl audit verify --tpm: {exc} (with swtpm, stop sitsd first: it holds the only connection)",
              file=sys.stderr)
        return 2
    finally:
        if counter is not None:
            counter.close()  # not held while the log is read: with /dev/tpmrm0 a running sitsd goes on anchoring
    return counter, nv_index, value


def _audit_anchors(args, target: Path, files: list[Path], tpm=None) -> int:
    """After the chain verified: the anchor_gap records sitsd wrote when it found a deletion at a start (exit 1: the
    log is not complete), and with --tpm the TPM counter (read before the files were listed) against the newest
    anchor record (audit.anchor: tpm)."""
    from .audit import AnchorScanError, anchor_summary
    from .audit_anchor import AnchorTpmError, describe_gaps, verify_against_tpm

    try:
        summary = anchor_summary(files)
    except AnchorScanError as exc:  # a malformed anchor record whose hash chain verified: forged, or a bug
        print(f"{exc}", file=sys.stderr)
        return 1
    gaps = describe_gaps(summary["gaps"])
    for line in gaps:
        print(line, file=sys.stderr)
    newest = summary["newest"]
    if Path(target).is_dir():
        _audit_tail_caveat(files[-1], newest is not None and summary["after_newest"] == 0)
    if tpm is None:
        if newest is not None:
            print(f"newest anchor: counter {newest['counter']} ({newest['file']}:{newest['line']}); "
                  "add --tpm to compare it with the TPM counter (a cut of the newest records shows only there)")
        return 1 if gaps else 0
    counter, nv_index, value = tpm
    try:  # how far a running sitsd got while the log was read (its anchors are on disk before the counter moves)
        after = counter.read()
    except AnchorTpmError:
        after = None
    finally:
        counter.close()
    complete, lines = verify_against_tpm(summary, value, nv_index, after)
    for line in lines:
        print(line, file=sys.stdout if complete else sys.stderr)
    return 0 if complete and not gaps else 1


def _audit_tail_caveat(newest_file: Path, anchored: bool) -> None:
    """`audit verify`: the chain cannot show a cut of its own tail. A clean stop ends the newest segment with a
    `close` record (a cut removes it); an anchor after the newest command record lets --tpm show it. Without
    either (a running sitsd's live segment, a crash, or a cut), say so; never a failure."""
    from .audit import segment_tail

    tail = segment_tail(newest_file)
    where = f"{newest_file.name}:{tail['line']}, seq {tail['seq']}, hash {tail['hash'][:16]}…"
    if tail["closed"]:
        print(f"newest segment closed cleanly (close record at {where}); a newer segment deleted whole would not "
              "show: compare with audit_head, or use audit.anchor: tpm and --tpm")
    elif not anchored:
        print(f"caveat: the newest records are not covered: {newest_file.name} has no close record (sitsd is running, "
              "or it crashed, or its tail was cut) and no anchor follows them, so a cut of the tail would not show; "
              f"compare the last record ({where}) with audit_head from sitsctl status or enable audit.anchor: tpm")


def load_audit_dir(args) -> str:
    from .config import load_config

    return str(load_config(args.config, parse_overrides(args.set)).audit.directory)


def _cmd_reload(args) -> int:
    from .control import request

    answer = request(_socket_path(args), "reload")
    if answer.get("reloaded"):
        print(f"reloaded; changed: {', '.join(answer['changed']) or 'nothing'}")
        return 0
    print(f"reload refused: {answer.get('error')}", file=sys.stderr)
    return 1


def _cmd_top(args) -> int:
    from .top import run_top

    return run_top(_socket_path(args), args.interval, args.iterations)


def _cmd_check_config(args) -> int:
    from .config import load_config

    cfg = load_config(args.config, parse_overrides(args.set))
    print(f"{args.config}: OK ({len(cfg.signals)} signals, {len(cfg.constraints)} constraints, "
          f"model {cfg.model.artifact}, PLC {cfg.plc.endpoint}, attestation {cfg.attestation.mode})")
    return 0


def _cmd_check(args) -> int:
    from .check import run_check
    from .config import load_config

    cfg = load_config(args.config, parse_overrides(args.set))
    result = run_check(cfg, max_splits=args.max_splits)
    print(result.pop("report"))
    is_artifact = cfg.model.artifact is not None and Path(cfg.model.artifact).is_dir()
    if result["bounds_proven"] and cfg.model.kind == "mlp" and (args.certificate or is_artifact):
        from .check import certify_model

        cert = certify_model(cfg, result, max_splits=args.max_splits)
        # what the certificate is for: the model, and the constraint set (sitsd.check.constraints_sha256) whose
        # admissible box it covers; a hot swap refuses it under other constraints
        result["certificate"] = {"model_sha256": cert.model_sha256, "constraints_sha256": cert.constraints_sha256,
                                 "method": cert.method}
        if is_artifact:  # the manifest carries it; a hot swap re-checks it before the model goes live
            from ep.artifact import attach_certificate

            where = attach_certificate(cfg.model.artifact, json.loads(cert.to_json()))
            result["certificate"]["stored_in"] = str(where)
            print(f"certificate stored in {where} (constraints SHA-256 {cert.constraints_sha256})")
        if args.certificate:
            args.certificate.write_text(cert.to_json())
            result["certificate"]["written_to"] = str(args.certificate)
            print(f"certificate written to {args.certificate} (constraints SHA-256 {cert.constraints_sha256})")
    if args.json:
        print(json.dumps(result))
    return 0 if result["satisfiable"] and result["bounds_proven"] and not result["unreachable"] else 1


def _cmd_pki(args) -> int:
    def _pki_owner(spec: str | None) -> tuple[int, int, str] | None:
        """`--owner USER[:GROUP]` as (uid, gid, name); None: leave files as they are. Without --owner:
        the daemon's user sitsd (and its primary group) when that user exists here."""
        import grp
        import pwd

        if spec is None:
            try:
                pw = pwd.getpwnam("sitsd")
            except KeyError:
                print("note: there is no user sitsd on this machine, files keep their owner "
                      f"(uid {os.geteuid()}); give --owner USER when the daemon runs as another user")
                return None
            return pw.pw_uid, pw.pw_gid, "sitsd"
        user, _, group = spec.partition(":")
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise SystemExit(f"sitsctl pki: --owner {spec}: no user {user!r} on this machine") from None
        try:
            gid = grp.getgrnam(group).gr_gid if group else pw.pw_gid
        except KeyError:
            raise SystemExit(f"sitsctl pki: --owner {spec}: no group {group!r} on this machine") from None
        return pw.pw_uid, gid, spec if group else user

    from plc.opcua_security import Pki, subject_cn, thumbprint

    from .config import load_config

    cfg = load_config(args.config, parse_overrides(args.set))
    pki = Pki(cfg.plc.pki_dir)
    owner = None
    if args.action in ("init", "trust"):
        # decided before anything is written: a refusal leaves nothing half-owned behind
        owner = _pki_owner(args.owner)
        if owner is not None and os.geteuid() != 0 and owner[0] != os.geteuid():
            raise SystemExit(f"sitsctl pki {args.action}: only root can give files to {owner[2]}; run it as root "
                             f"(sudo sitsctl pki {args.action} ...), or as {owner[2]} itself")
    if args.action == "init":
        if pki.has_own() and not args.force:
            cert = pki.load_own()
            print(f"{pki.own_cert} exists (CN={subject_cn(cert)}, SHA-1 {thumbprint(cert)}); --force replaces it")
        else:
            cert = pki.create_own(cfg.plc.application_uri, f"sitsd {cfg.line}", server=False)
            print(f"created {pki.own_cert} and {pki.own_key} (CN={subject_cn(cert)}, SHA-1 {thumbprint(cert)})")
    elif args.action == "trust":
        from cryptography import x509

        if args.certificate is None:
            raise SystemExit("sitsctl pki trust: give the certificate file to trust")
        data = args.certificate.read_bytes()
        cert = x509.load_pem_x509_certificate(data) if data.startswith(b"-----") else x509.load_der_x509_certificate(data)
        print(f"trusted CN={subject_cn(cert)} (SHA-1 {thumbprint(cert)}): {pki.trust(cert)}")
    else:
        if pki.has_own():
            cert = pki.load_own()
            print(f"own      CN={subject_cn(cert)}  SHA-1 {thumbprint(cert)}  valid until {cert.not_valid_after_utc:%Y-%m-%d}")
        else:
            print(f"own      none (run: sitsctl pki init --config {args.config})")
        for label, folder in (("trusted", pki.trusted), ("rejected", pki.rejected)):
            files = sorted(folder.iterdir()) if folder.is_dir() else []
            print(f"{label:8} {len(files)} certificate(s) in {folder}")
            for f in files:
                print(f"           {f.name}")
        return 0
    if owner is not None:
        uid, gid, name = owner
        changed = pki.hand_over(uid, gid)
        print(f"owner: {pki.root} and everything in it belong to {name} (uid {uid}, gid {gid})"
              + (f"; changed {len(changed)} path(s)" if changed else "; nothing to change"))
    if args.action == "init":
        print(f"next: add {pki.own_cert} to the PLC's trusted client certificates, and put the PLC's "
              f"certificate into {pki.trusted} (or `sitsctl pki trust --config ... CERT`)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sitsctl", description="Control and inspect sits2026 (sitsd).",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="run the closed loop against the built-in PLC simulator",
                          description="Starts swtpm (if installed), the rolling-mill PLC simulator and sitsd, runs "
                          "the closed loop, prints progress each second and a summary at the end. The simulator "
                          "verifies every signed command; its twin plant without commands gives the open-loop error.")
    demo.add_argument("--seconds", type=float, default=20.0, help="how long to run (default 20)")
    demo.add_argument("--json", action="store_true", help="print the summary as one JSON object on the last line")
    demo.add_argument("--config", type=Path, default=None, help="config to run (default examples/rolling-mill.yaml)")
    demo.add_argument("--software", action="store_true", help="use a software key even if swtpm is installed")
    demo.add_argument("--accept-model", action="append", default=[], type=Path, metavar="PATH",
                      help="the simulated PLC also accepts commands from this model (ONNX file or `sitsctl compile` "
                      "artifact), besides the demo model it pins: try `sitsctl update --model PATH` on the running "
                      "demo (docs/hotswap.md). Repeatable; any signing mode (tpm-session: sitsd writes a new "
                      "session credential after the swap), not with --certify-session")
    demo.add_argument("--seed", type=int, default=1, help="disturbance sequence seed (default 1)")
    demo.add_argument("--rate", type=float, default=100.0, help="sensor frames per second (default 100)")
    demo.add_argument("--transport", choices=("udp", "opcua", "eth"), default="udp",
                      help="how frames reach sitsd: UADP over UDP multicast (default), an OPC UA subscription, "
                      "or UADP over raw Ethernet with a VLAN tag (simulator in a network namespace; needs root)")
    demo.add_argument("--security", choices=("none", "sign", "sign-and-encrypt"), default="sign-and-encrypt",
                      help="OPC UA message security between sitsd and the simulator (default sign-and-encrypt)")
    demo.add_argument("--signing", choices=("tpm-session", "tpm-direct"), default="tpm-session",
                      help="with swtpm: a session key bound by one TPM quote (default), or TPM2_Sign per command")
    demo.add_argument("--certify-session", action="store_true",
                      help="with swtpm and tpm-session: a throwaway authority approves the demo's model and modules, "
                           "the TPM certifies the session key only in that measured state and the simulated PLC "
                           "accepts only a certified key (attestation.certify_session; hot swaps are then refused)")
    demo.add_argument("--field-encoding", choices=("variant", "raw"), default="variant",
                      help="UADP field encoding of the sensor frames (default variant)")
    demo.add_argument("--profile", choices=("simulator", "s7-1500", "controllogix", "melsec-iq-r"),
                      default="simulator", help="the simulator emulates this vendor's status word and diagnostic "
                      "texts; sitsd decodes them into structured PLC events with the same profile")
    demo.add_argument("--proofs", type=int, default=100, metavar="N",
                      help="prove every N-th command with Groth16 off the fast path, then verify every proof "
                      "with sits2026 and snarkjs (default 100; 0: no proofs)")
    demo.add_argument("--onnx", action="store_true",
                      help="run the config's .onnx as is; by default the demo runs the artifact "
                      "examples/compile-demo-model.sh compiles from it (cached after the first run)")

    def metrics_address(text: str) -> str:  # checked while parsing (argparse: "invalid metrics_address value")
        from .demo import parse_metrics_address

        parse_metrics_address(text)
        return text

    demo.add_argument("--metrics", metavar="HOST:PORT", default=None, type=metrics_address,
                      help="serve the daemon's Prometheus metrics at http://HOST:PORT/metrics while the demo runs "
                      "(port 0: a free one; the URL is printed and is metrics_url in --json). The endpoint stays up "
                      "until the summary is taken, so its sitsd_latency_seconds histogram covers the same commands as "
                      "the summary's latency (PLC send -> write acknowledged; count = commands - 1, the startup "
                      "fail-safe has no frame). Without it the demo's daemon serves metrics on a free 127.0.0.1 port")
    demo.set_defaults(func=_cmd_demo)

    status = sub.add_parser("status", help="ask a running sitsd for uptime, model, signer, counters, latency")
    status.add_argument("--config", type=Path, default=Path("/etc/sits2026/sitsd.yaml"),
                        help="the daemon's config, to find its control socket")
    status.add_argument("--socket", default=None, help="control socket path (instead of --config)")
    status.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    status.add_argument("--json", action="store_true", help="print the raw status JSON")
    status.set_defaults(func=_cmd_status)

    au = sub.add_parser("audit", help="verify the audit log's hash chain, or show its records",
                        description="verify: every record's hash and link, naming the first edited, deleted, "
                        "reordered, damaged or truncated record (exit 1 if any file fails, or if the log records a "
                        "deletion sitsd found at a start: anchor_gap); with --tpm also the TPM anchor counter. Without "
                        "a close record (a clean stop) or an anchor after the newest records, a cut of the tail cannot "
                        "show: verify says so. show: the records, readably (a line that cannot be read is named "
                        "on stderr and skipped, exit 1).")
    au.add_argument("action", choices=("verify", "show"))
    au.add_argument("path", nargs="?", type=Path, help="an audit directory or file (default: audit.directory)")
    au.add_argument("--config", type=Path, default=Path("/etc/sits2026/sitsd.yaml"))
    au.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    au.add_argument("--last", type=int, default=None, help="show: only the last N records of each file")
    au.add_argument("--full", action="store_true",
                    help="show: also each record's file:line, model hash, input digest, proof reference and envelope")
    au.add_argument("--tpm", action="store_true",
                    help="verify: also compare the TPM anchor counter (audit.anchor: tpm) with the newest anchor "
                    "record; exit 1 if the TPM is ahead (the newest records were deleted). The TPM: --tcti or "
                    "SITS_TCTI, else attestation.tcti of --config. With swtpm, stop sitsd first")
    au.add_argument("--nv-index", type=lambda v: int(v, 0), default=None, metavar="INDEX",
                    help="--tpm: the counter's NV index (default: audit.anchor_nv_index of --config, else the "
                    "index the newest anchor record names)")
    au.set_defaults(func=_cmd_audit)

    rl = sub.add_parser("reload", help="re-read the running daemon's config and apply what can change live",
                        description="Constraints, signal limits, timing and safety limits change between two "
                        "frames; PLC, transport, model and attestation changes need a restart and are refused.")
    rl.add_argument("--config", type=Path, default=Path("/etc/sits2026/sitsd.yaml"))
    rl.add_argument("--socket", default=None, help="control socket path (instead of --config)")
    rl.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    rl.set_defaults(func=_cmd_reload)

    top = sub.add_parser("top", help="live view of a running sitsd: rates, drops, latency, stages, alerts")
    top.add_argument("--config", type=Path, default=Path("/etc/sits2026/sitsd.yaml"),
                     help="the daemon's config, to find its control socket")
    top.add_argument("--socket", default=None, help="control socket path (instead of --config)")
    top.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    top.add_argument("--iterations", type=int, default=None, help="stop after this many refreshes")
    top.set_defaults(func=_cmd_top)

    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("--config", type=Path, required=True)
    check.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    check.set_defaults(func=_cmd_check_config)

    check = sub.add_parser("check", help="prove the constraints satisfiable and the model inside the actuator limits",
                           description="Deploy-time checks: the constraint set with z3 (satisfiable, contradictory "
                           "and redundant constraints by name, bounding box of the admissible inputs), then sound "
                           "output bounds of the model over that box (IBP, CROWN, input splitting) against the "
                           "safety envelope's actuator limits. Exit code 0 only if both hold.")
    check.add_argument("--config", type=Path, required=True)
    check.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    check.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    check.add_argument("--max-splits", type=int, default=256, help="input splits allowed to tighten bounds")
    check.add_argument("--certificate", type=Path, default=None, help="write the bounds certificate here when proven")
    check.set_defaults(func=_cmd_check)

    pki = sub.add_parser("pki", help="OPC UA certificates: create this device's, trust the PLC's, list both",
                         description="Manages plc.pki_dir: own/cert.der and own/private/key.pem (this device), "
                         "trusted/certs (PLC certificates sitsd accepts), rejected/certs (refused ones, saved "
                         "for review: move a file to trusted/certs to accept it). Run init and trust as root: "
                         "they hand what they write to the daemon's user (--owner).")
    pki.add_argument("action", choices=("init", "trust", "show"))
    pki.add_argument("certificate", nargs="?", type=Path, help="for trust: the PLC certificate (DER or PEM)")
    pki.add_argument("--config", type=Path, required=True)
    pki.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    pki.add_argument("--force", action="store_true", help="init: replace an existing certificate")
    pki.add_argument("--owner", metavar="USER[:GROUP]", default=None,
                     help="init, trust: give plc.pki_dir and everything in it to this user (and its group, or "
                     "GROUP), so that the daemon can read its key and save refused certificates; needs root. "
                     "Default: the daemon's user sitsd when it exists, else files keep their owner")
    pki.set_defaults(func=_cmd_pki)

    __import__("sitsd.cli_update").cli_update.register(sub)  # sitsctl update / rollback (hot swap)
    __import__("sitsd.cli_diagnose").cli_diagnose.register(sub)  # sitsctl diagnose (fault attribution)
    __import__("sitsd.cli_zk").cli_zk.register(sub)  # sitsctl zk-setup / prove / verify-proof (Groth16)
    __import__("sitsd.cli_deploy").cli_deploy.register(sub)  # sitsctl deploy, sitsctl policy keygen / approve
    __import__("sitsd.cli_sign").cli_sign.register(sub)  # sitsctl sign / verify-signature (detached signatures)
    __import__("sitsd.cli_module").cli_module.register(sub)  # sitsctl build-module (WAT -> checked .wasm)
    __import__("sitsd.cli_enroll").cli_enroll.register(sub)  # sitsctl enroll (AK enrollment, docs/enroll.md)
    __import__("sitsd.cli_measurements").cli_measurements.register(sub)  # sitsctl measurements verify (PCR 23 log)
    sub.add_parser("plcsim", help="run the rolling-mill PLC simulator (see sitsctl plcsim --help)",
                   add_help=False)
    sub.add_parser("compile", help="compile an ONNX model into a verified artifact: graph passes, FP8/int8 "
                   "weights, zstd weight container, manifest (see sitsctl compile --help)", add_help=False)
    return ap


def _take_global_tcti(argv: list[str]) -> list[str]:
    """`--tcti STRING` anywhere (before `--`), else SITS_TCTI, becomes the attestation.tcti every config
    sitsctl loads gets (under its own --set); returns argv without it."""
    from . import config

    tcti, rest, i = os.environ.get("SITS_TCTI") or None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg == "--tcti" and i + 1 < len(argv):
            tcti, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--tcti="):
            tcti, i = arg.split("=", 1)[1], i + 1
            continue
        rest.append(arg)
        i += 1
    config.CLI_OVERRIDES.clear()
    if tcti:
        config.CLI_OVERRIDES["attestation.tcti"] = tcti
    return rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plcsim"]:  # its own parser, so that `sitsctl plcsim --help` shows the simulator's options
        from .plcsim import main as plcsim_main

        return plcsim_main(argv[1:])
    if argv[:1] == ["compile"]:  # the model compiler lives in ep and has its own parser
        from ep.compile import main as compile_main

        return compile_main(argv[1:])
    argv = _take_global_tcti(argv)
    args = build_parser().parse_args(argv)
    from .log import configure

    configure("warning")
    try:
        return args.func(args)
    except SitsError as exc:
        print(f"sitsctl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
