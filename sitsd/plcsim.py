"""Runs the rolling-mill PLC simulator as its own process, wired to the envelope verifier.

    python -m sitsd.plcsim --udp-url opc.udp://239.255.10.1:4840 --trust-key signer.pub.pem
    python -m sitsd.plcsim --enrollment enrollment.json --model-sha256 HEX     (tpm-session, enrolled AK only)

Prints one JSON line `{"ready": true, "endpoint": ..., "udp_url": ...}` when serving, and the
final stats as a JSON line when it stops (SIGINT, SIGTERM or --duration). With --control-stdin
(used by the demo and the tests) it reads commands from stdin: `stats` prints a JSON stats line,
`clock-offset-ms N` makes the PLC's clock jump: the sender stamp of every frame published from then on is
N ms ahead (negative: behind) of the host clock, 0 restores it; it answers `{"clock_offset_ms": N}`, or
`{"error": ...}` for a bad N; `publish-factor K` publishes K frames per physics tick from then on (K times
the nominal rate, 1 restores: a subscriber flooded by its own PLC), answering `{"publish_factor": K}`. `stop` or the end of input stops it. The trusted key is read when the first command arrives if it did not exist at
start, so the simulator can be started before sitsd writes its public key.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from pathlib import Path

from attestation.envelope import EnvelopeVerifier
from plc.simulator.server import CommandRejected, RollingMillSimulator, SimulatorSettings


def also_accepted_models(args, session_mode: bool) -> tuple[bytes, ...]:
    """--also-accept-model-sha256, checked: SHA-256 digests, with --model-sha256, not with --approval."""
    given = args.also_accept_model_sha256
    if not given:
        return ()
    try:
        also = tuple(bytes.fromhex(h) for h in given)
    except ValueError:
        also = ()
    if len(also) != len(given) or any(len(m) != 32 for m in also):
        raise SystemExit("sitsctl plcsim: --also-accept-model-sha256 takes a SHA-256 in hex (64 digits)")
    if not args.model_sha256:
        raise SystemExit("sitsctl plcsim: --also-accept-model-sha256 goes with --model-sha256 (without it every "
                         "model is accepted)")
    if getattr(args, "approval", None) is not None:
        raise SystemExit("sitsctl plcsim: --also-accept-model-sha256 cannot go with --approval: the approval pins one "
                         "measured state (its model and modules)")
    return also


class LazyVerifier:
    def __init__(self, key_path: Path, model_sha256: bytes | None, freshness: dict | None = None,
                 also_accepted_models: tuple[bytes, ...] = ()) -> None:
        self.key_path = key_path
        self.model_sha256 = model_sha256
        self.also_accepted_models = also_accepted_models
        # EnvelopeVerifier's freshness options (freshness_options); empty: its defaults, which check freshness
        self.freshness = freshness or {}
        self._verifier: EnvelopeVerifier | None = None

    def __call__(self, envelope: bytes):
        if self._verifier is None:
            try:
                self._verifier = EnvelopeVerifier(self.key_path.read_bytes(), self.model_sha256,
                                                  also_accepted_models=self.also_accepted_models, **self.freshness)
            except (OSError, ValueError) as exc:
                raise CommandRejected(f"no trusted key at {self.key_path}: {exc}", "key") from exc
        env = self._verifier.verify(envelope)
        return env.command.sequence, env.command.values, env.command.failsafe


class SessionAcceptor:
    """Checks a session credential (TPM quote over the session key and this PLC's nonce) and returns the
    per-command verifier for that session. One SessionReplayState across every credential, so a new session
    cannot take back an earlier one's nonce, session key or command sequence numbers.

    With `enrollment` (attestation.tpm.enroll.Enrollment, a checked `sitsctl enroll` record) the AK it names is
    the only one trusted and `device_key_path` is not read; a credential quoted by another AK is refused with
    CredentialError code "ak" naming the enrollment file. Without it, the AK is read from `device_key_path`
    (sitsd writes it: trusted as found)."""

    def __init__(self, device_key_path: Path | None, model_sha256: bytes | None, freshness: dict | None = None,
                 policy_key_path: Path | None = None, approval=None, authority=None, *, enrollment=None,
                 also_accepted_models: tuple[bytes, ...] = ()) -> None:
        if device_key_path is None and enrollment is None:
            raise ValueError("SessionAcceptor needs the device's AK: device_key_path or enrollment")
        self.enrollment = enrollment
        self.device_key_path = device_key_path
        self.model_sha256 = model_sha256
        self.freshness = freshness or {}
        self.policy_key_path = policy_key_path  # require a session key certified by this policy-bound device key
        self.pin = {"approval": approval, "authority": authority} if approval is not None else {}
        self.also_accepted_models = tuple(also_accepted_models)  # a planned swap's models (SessionVerifier)
        from attestation.session import SessionReplayState

        self.replay_state = SessionReplayState()  # kept when the verifier is rebuilt (a re-provisioned device key)

    def __call__(self, credential: bytes, nonce: bytes):
        from attestation.session import SessionVerifier

        if self.model_sha256 is None:
            raise CommandRejected("tpm-session verification needs --model-sha256", "model")
        trusted = None
        if self.enrollment is None:
            try:
                trusted = self.device_key_path.read_bytes()
            except OSError as exc:
                raise CommandRejected(f"no device key at {self.device_key_path}: {exc}", "key") from exc
        options = dict(self.freshness)
        if self.also_accepted_models:
            options["also_accepted_models"] = self.also_accepted_models
        if self.policy_key_path is not None:
            try:
                options["trusted_device_key_pem"] = self.policy_key_path.read_bytes()
            except OSError as exc:
                raise CommandRejected(f"no policy key at {self.policy_key_path}: {exc}", "key") from exc
            options.update(self.pin)
        if self.enrollment is not None:
            from attestation.tpm.enroll import EnrolledSessionVerifier

            verifier = EnrolledSessionVerifier(self.enrollment, self.model_sha256, replay_state=self.replay_state,
                                               **options).accept(credential, nonce)
        else:
            verifier = SessionVerifier(trusted, self.model_sha256, replay_state=self.replay_state,
                                       **options).accept(credential, nonce)

        def verify(envelope: bytes):
            env = verifier.verify(envelope)
            return env.command.sequence, env.command.values, env.command.failsafe

        return verify


def measurement_pins(args: argparse.Namespace) -> dict:
    """SessionVerifier's measurement pins from --expect-module, --expect-config-sha256, --require-measurements."""
    pins: dict = {}
    modules = {}
    for item in args.expect_module:
        stage, sep, sha = item.partition("=")
        stage, sha = stage.strip(), sha.strip().lower()
        if not sep or stage not in ("pre", "post"):
            raise SystemExit(f"sitsctl plcsim: --expect-module {item!r}: write STAGE=SHA256 with STAGE pre or post")
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise SystemExit(f"sitsctl plcsim: --expect-module {item!r}: the SHA-256 must be 64 hex digits "
                             "(sha256sum of the module file)")
        if stage in modules:
            raise SystemExit(f"sitsctl plcsim: --expect-module: stage {stage} given twice")
        modules[stage] = sha
    if modules:
        pins["expected_modules"] = modules
    if args.expect_config_sha256 is not None:
        sha = args.expect_config_sha256.strip().lower()
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise SystemExit("sitsctl plcsim: --expect-config-sha256 must be 64 hex digits (sha256sum of the config)")
        pins["expected_config_sha256"] = sha
    if args.require_measurements:
        pins["require_measurements"] = True
    return pins


def freshness_options(args: argparse.Namespace) -> dict:
    """EnvelopeVerifier's freshness options from --max-age-ms and --deadline-grace-ms: every bound explicit;
    --max-age-ms 0 is the explicit opt-out (no time checks at all)."""
    if args.max_age_ms <= 0:
        return {"freshness": False}
    if args.deadline_grace_ms < 0:
        raise SystemExit(f"sitsctl plcsim: --deadline-grace-ms must not be negative, got {args.deadline_grace_ms:g}")
    ns = int(args.max_age_ms * 1e6)
    return {"max_age_ns": ns, "deadline_grace_ns": int(args.deadline_grace_ms * 1e6), "max_future_ns": ns,
            "max_validity_ns": ns}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sitsctl plcsim", description="Rolling-mill PLC simulator (OPC UA server + "
                                 "UADP publisher) that verifies every command envelope before applying it.")
    ap.add_argument("--udp-url", default="opc.udp://239.255.10.1:4840", help="where sensor frames are published")
    ap.add_argument("--interface", default="127.0.0.1", help="address of the interface for multicast")
    ap.add_argument("--host", default="127.0.0.1", help="address the OPC UA server listens on")
    ap.add_argument("--port", type=int, default=4840, help="OPC UA port (0: any free port)")
    ap.add_argument("--eth-url", default=None,
                    help="publish UADP over raw Ethernet instead of UDP, e.g. opc.eth://01-00-5E-7F-00-01:100.5")
    ap.add_argument("--eth-interface", default=None, help="interface for --eth-url (needs CAP_NET_RAW)")
    ap.add_argument("--profile", choices=("simulator", "s7-1500", "controllogix", "melsec-iq-r"),
                    default="simulator", help="emulate this vendor's status word and diagnostic texts")
    ap.add_argument("--field-encoding", choices=("variant", "raw"), default="variant",
                    help="UADP field encoding: Double Variants (default) or RawData")
    ap.add_argument("--launch-offset-us", type=float, default=None,
                    help="with --eth-url: send each frame with an SO_TXTIME launch time this far ahead (TSN, etf qdisc)")
    ap.add_argument("--rate", type=float, default=100.0, help="frames per second (default 100)")
    ap.add_argument("--seed", type=int, default=1, help="disturbance sequence seed")
    ap.add_argument("--publisher-id", type=int, default=7)
    ap.add_argument("--trust-key", type=Path, default=None,
                    help="PEM public key whose envelopes are accepted (sitsd writes <audit dir>/signer.pub.pem)")
    ap.add_argument("--trust-device-key", type=Path, default=None,
                    help="tpm-session: the device's TPM attestation key (<audit dir>/device.pub.pem), trusted as "
                    "found (sitsd writes it); commands are accepted once a session credential quoted by it against "
                    "this PLC's nonce verifies. Prefer --enrollment")
    ap.add_argument("--enrollment", type=Path, default=None, metavar="FILE",
                    help="tpm-session: the device's enrollment record (`sitsctl enroll --verify -o FILE`). It is "
                    "checked at start (integrity digest, signature with --enrollment-authority, a restricted "
                    "TPM-resident AK bound to the EK by credential activation; a bad record stops the simulator "
                    "with what to fix) and its AK is then the only one trusted: a session credential quoted by any "
                    "other AK is refused (code ak). Replaces --trust-device-key (ignored if also given)")
    ap.add_argument("--enrollment-authority", type=Path, default=None, metavar="PUB.pem",
                    help="with --enrollment: accept the record only if signed by this P-256 public key (the "
                    "enrolling verifier's, `sitsctl enroll --verify --signing-key`)")
    ap.add_argument("--require-ek-trust", default=None,
                    choices=("certificate-chain", "pinned", "certificate-unchecked", "none"),
                    help="with --enrollment: the weakest EK trust accepted, strongest first: certificate-chain "
                    "(EK certificate checked against the TPM maker's CA), pinned (EK recorded at commissioning), "
                    "certificate-unchecked, none; default: any the record has. A level above none needs "
                    "--enrollment-authority (ek_trust is a field of the record: only its signature protects it)")
    ap.add_argument("--trust-policy-key", type=Path, default=None,
                    help="with --trust-device-key or --enrollment: accept only a session key certified by this "
                    "PolicyAuthorize-bound "
                    "device key (<audit dir>/device-policy.pub.pem, written by sitsd with attestation.certify_session), "
                    "which the TPM certifies only while the measured model and modules are the approved ones. "
                    "The enrollment does not cover this key: it is trusted as found, even with --enrollment "
                    "(docs/enroll.md)")
    ap.add_argument("--approval", type=Path, default=None,
                    help="with --trust-policy-key: accept only a certification under this approval (sitsctl policy "
                    "approve), which must approve --model-sha256; needs --authority-pub")
    ap.add_argument("--authority-pub", type=Path, default=None, help="the authority public key --approval is checked with")
    ap.add_argument("--model-sha256", default=None, help="accept only commands from this model (hex)")
    ap.add_argument("--also-accept-model-sha256", action="append", default=[], metavar="HEX",
                    help="accept commands from this model too, besides --model-sha256 (a PLC told about a model "
                    "update before the edge swaps to it); repeat for more. With tpm-session (--trust-device-key, "
                    "--enrollment) a session credential may measure any of them, and its commands may carry any of "
                    "them (right after a swap they come before the new credential sitsd writes). Not with "
                    "--approval, nor useful with --trust-policy-key (the TPM certifies one measured state)")
    ap.add_argument("--expect-module", action="append", default=[], metavar="STAGE=SHA256",
                    help="tpm-session: accept a session credential only if its measurement log (PCR 23, quoted with "
                    "the session key) says this module runs at STAGE (pre or post); repeat for each stage. The "
                    "modules pinned must be exactly the ones the log names (refused: code module)")
    ap.add_argument("--expect-config-sha256", default=None, metavar="HEX",
                    help="tpm-session: accept a session credential only if its measurement log says this config "
                    "runs (the SHA-256 of the config file; refused: code config)")
    ap.add_argument("--require-measurements", action="store_true",
                    help="tpm-session: refuse a credential without a measurement log (an older sitsd, or measurement "
                    "off; code unmeasured). Implied by --expect-module and --expect-config-sha256")
    ap.add_argument("--max-age-ms", type=float, default=1000.0,
                    help="refuse commands issued more than this long ago, valid for longer than this, or issued "
                    "this far in this host's future (the PLC side's freshness check; clocks must agree, as they "
                    "do on one host or under PTP); 0 turns it off (default 1000)")
    ap.add_argument("--deadline-grace-ms", type=float, default=200.0,
                    help="accept a command this long past the deadline it carries (transport and scheduling "
                    "between sitsd's check and this one; default 200)")
    ap.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--security", choices=("none", "sign", "sign-and-encrypt"), default="none",
                    help="OPC UA message security (Basic256Sha256); anything but none needs --pki")
    ap.add_argument("--pki", type=Path, default=None,
                    help="PKI directory: own certificate (created if missing), trusted/certs for client certificates")
    ap.add_argument("--opcua-frames", action="store_true",
                    help="also write every frame to RollingMill.SensorFrame (for the opcua-subscription transport)")
    ap.add_argument("--control-stdin", action="store_true",
                    help="take 'stats', 'clock-offset-ms N' (shift the frames' sender stamps by N ms from "
                    "now on, 0 restores), 'publish-factor K' (K times the nominal frame rate, 1 restores) and 'stop' lines on stdin; end of input stops the simulator")
    ap.add_argument("--fault", default=None, metavar="KIND@SECONDS[:SIGNAL][xMAG]",
                    help="inject a fault at that time, e.g. stuck_sensor@20:entry_thickness, plc_fault@15, roll_wear@10x2 "
                    "(kinds: sensor_drift stuck_sensor clock_skew network_delay actuator_saturation roll_wear plc_fault)")
    return ap


def load_enrollment_arg(args):
    """The checked --enrollment record (attestation.tpm.enroll.Enrollment), or None; SystemExit saying what to fix."""
    if args.enrollment is None:
        return None
    from attestation.tpm.enroll import EnrollError, EnrollOptionError, load_enrollment_checked

    try:
        enrollment = load_enrollment_checked(args.enrollment, authority_path=args.enrollment_authority,
                                             min_ek_trust=args.require_ek_trust)
    except EnrollOptionError as exc:
        raise SystemExit(f"sitsctl plcsim: {exc.reason}") from None
    except EnrollError as exc:
        raise SystemExit(f"sitsctl plcsim: --enrollment: {exc.reason}") from None
    notes = [f"trusting only AK sha256:{enrollment.ak_fingerprint}… (name {enrollment.ak_name[:20]}…) enrolled in "
             f"{args.enrollment}, ek_trust {enrollment.ek_trust}"]
    if enrollment.signature_checked:
        notes.append(f"record signature verified (key {enrollment.signed_by[:16]}…)")
    else:
        notes.append("WARNING: the record's signature was NOT checked (no --enrollment-authority): whoever could "
                     f"write {args.enrollment} chose this AK (an unsigned record's digest can be recomputed by "
                     "anyone); sign it with `sitsctl enroll --verify --signing-key KEY.pem` and give the public key "
                     "with --enrollment-authority PUB.pem")
    if args.trust_device_key is not None:
        notes.append(f"--trust-device-key {args.trust_device_key} is not used")
    print(f"sitsctl plcsim: {'; '.join(notes)}", file=sys.stderr, flush=True)
    return enrollment


def _check_fault(text: str | None, profile: str) -> str | None:
    from plc.simulator.faults import FaultError, parse_fault

    if text is None:
        return None
    try:
        spec = parse_fault(text, profile)
    except FaultError as exc:
        raise SystemExit(f"sitsctl plcsim: --fault: {exc}") from None
    if spec.kind == "model_drift":
        raise SystemExit("sitsctl plcsim: --fault model_drift: the model runs in sitsd, not in the PLC; "
                         "bench/rca.py injects it in its offline scenarios")
    return text


async def run(args) -> int:
    settings = SimulatorSettings(udp_url=args.udp_url, interface=args.interface, rate_hz=args.rate, seed=args.seed,
                                 publisher_id=args.publisher_id, port=args.port, host=args.host,
                                 eth_url=args.eth_url, eth_interface=args.eth_interface,
                                 launch_offset_us=args.launch_offset_us, field_encoding=args.field_encoding,
                                 profile=args.profile,
                                 security=args.security, pki_dir=str(args.pki) if args.pki else None,
                                 publish_opcua_frames=args.opcua_frames, fault=_check_fault(args.fault, args.profile))
    if args.security != "none" and args.pki is None:
        raise SystemExit("sitsctl plcsim: --security needs --pki DIR")
    if bool(args.eth_url) != bool(args.eth_interface):
        raise SystemExit("sitsctl plcsim: --eth-url and --eth-interface go together")
    model = bytes.fromhex(args.model_sha256) if args.model_sha256 else None
    session_mode = args.trust_device_key is not None or args.enrollment is not None
    if args.trust_key is not None and args.enrollment is not None:
        raise SystemExit("sitsctl plcsim: --enrollment pins the TPM attestation key of tpm-session; --trust-key is "
                         "the envelope signer of the other signing modes: give one of them")
    if (args.trust_key is None) == (not session_mode):
        raise SystemExit("sitsctl plcsim: give exactly one of --trust-key and --trust-device-key (or --enrollment)")
    if args.trust_policy_key is not None and not session_mode:
        raise SystemExit("sitsctl plcsim: --trust-policy-key goes with --trust-device-key or --enrollment "
                         "(tpm-session)")
    if args.enrollment is None and (args.enrollment_authority is not None or args.require_ek_trust is not None):
        raise SystemExit("sitsctl plcsim: --enrollment-authority and --require-ek-trust go with --enrollment")
    enrollment = load_enrollment_arg(args)
    approval = authority = None
    if args.approval is not None or args.authority_pub is not None:
        if args.approval is None or args.authority_pub is None or args.trust_policy_key is None or model is None:
            raise SystemExit("sitsctl plcsim: --approval needs --authority-pub, --trust-policy-key and --model-sha256")
        from attestation.tpm.policy import Approval, PolicyError, load_authority_public

        try:
            approval, authority = Approval.load(args.approval), load_authority_public(args.authority_pub)
            approval.verify(authority)
        except PolicyError as exc:
            raise SystemExit(f"sitsctl plcsim: --approval: {exc.reason}") from None
        if approval.model_sha256 != model.hex():
            raise SystemExit(f"sitsctl plcsim: --approval approves model {approval.model_sha256}, not --model-sha256")
    freshness = freshness_options(args)
    pins = measurement_pins(args)
    if pins and not session_mode:
        raise SystemExit("sitsctl plcsim: --expect-module, --expect-config-sha256 and --require-measurements check "
                         "the tpm-session credential: they go with --trust-device-key or --enrollment")
    freshness = {**freshness, **pins}
    also = also_accepted_models(args, session_mode)
    if session_mode:
        sim = RollingMillSimulator(settings, None,
                                   session_acceptor=SessionAcceptor(args.trust_device_key, model, freshness,
                                                                    args.trust_policy_key, approval, authority,
                                                                    enrollment=enrollment,
                                                                    also_accepted_models=also))
    else:
        sim = RollingMillSimulator(settings, LazyVerifier(args.trust_key, model, freshness, also))
    await sim.start()
    publisher = threading.Thread(target=sim.run_publisher, args=(args.duration,), name="plcsim-publisher", daemon=True)
    publisher.start()
    time.sleep(0.05)  # let the publisher open its socket, so the READY line can report launch-time support
    print(json.dumps({"ready": True, "launch_time": sim.launch_time_status, "endpoint": sim.endpoint, "udp_url": args.udp_url, "eth_url": args.eth_url,
                      **({"enrollment": enrollment.describe()} if enrollment is not None else {})}),
          flush=True)
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:  # a daemon thread: a blocked readline must not hold up exit
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, "")

    if args.control_stdin:
        threading.Thread(target=read_stdin, name="plcsim-stdin", daemon=True).start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lines.put_nowait, "stop\n")
    try:
        while publisher.is_alive():
            try:
                line = await asyncio.wait_for(lines.get(), 0.5)
            except asyncio.TimeoutError:
                continue
            cmd = line.strip()
            if cmd == "stats":
                print(json.dumps({"stats": sim.stats()}), flush=True)
            elif cmd.split(None, 1)[:1] == ["clock-offset-ms"]:  # the PLC's clock jumps (fault injection)
                try:
                    offset_ns = sim.set_clock_offset_ms(float(cmd[len("clock-offset-ms"):].strip()))
                except ValueError as exc:
                    print(json.dumps({"error": f"clock-offset-ms N: N is a number of milliseconds ({exc})"}),
                          flush=True)
                else:
                    print(json.dumps({"clock_offset_ms": offset_ns / 1e6}), flush=True)
            elif cmd.split(None, 1)[:1] == ["publish-factor"]:  # K frames per tick: K x the nominal rate
                try:
                    factor = sim.set_publish_factor(int(cmd[len("publish-factor"):].strip()))
                except ValueError as exc:
                    print(json.dumps({"error": f"publish-factor K: K is an integer 1..100 ({exc})"}), flush=True)
                else:
                    print(json.dumps({"publish_factor": factor}), flush=True)
            elif cmd == "stop" or not line:
                break
    finally:
        sim.stop()
        publisher.join(2.0)
        print(json.dumps({"final": sim.stats()}), flush=True)
        await sim.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
