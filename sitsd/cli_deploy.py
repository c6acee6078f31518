"""sitsctl deploy (measured deployment, docs/deploy.md) and sitsctl policy keygen / approve (the authority)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

OK_LINE = "Verified: [OK] DeviceID={device} | ModelSHA256={model} | PolicySig={policy}"
# A running sitsd undoes a live load that is not confirmed (`deploy_commit`) within this many seconds of
# loading it (sitsd/deploy.py): ample time to verify its quote and stage the record on a slow, busy device.
CONFIRM_TIMEOUT_S = 30.0


class Fail(Exception):
    """One deployment check failed: the reason goes into the `Verified: [FAIL]` line."""


def _bool(text: str) -> bool:
    if text.lower() in ("true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def register(sub) -> None:
    dp = sub.add_parser(
        "deploy", help="verify and measure a config, model and modules into the TPM; stage for sitsd",
        description="Validates the config, checks the approval's signature against the authority key and the "
        "artifact's real SHA-256 against the approval and the config pin, provisions the policy-bound device key "
        "and the AK when absent, measures model, modules, config and approval into attestation.measurement_pcr, "
        "has the device key sign under PolicyAuthorize, quotes with a fresh nonce, verifies it all and stages the "
        "record in audit.directory/deployment.json for the next start. Prints one line: Verified: [OK] ... or "
        "Verified: [FAIL] <reason> (exit 1). See docs/deploy.md.")
    dp.add_argument("--config", type=Path, required=True)
    dp.add_argument("--attestation-mode", choices=("tpm2", "software", "none"), default=None,
                    help="tpm2: measure into the TPM and quote; software: the same log without a TPM (development); "
                    "none: checks only (default: attestation.mode of the config)")
    dp.add_argument("--verify-on-boot", type=_bool, default=False, metavar="{true,false}",
                    help="sitsd refuses to start unless its measurements match this deployment (default false)")
    dp.add_argument("--tcti", default=None, help="TPM to use (also a global option; default attestation.tcti, "
                    "or SITS_TCTI)")
    dp.add_argument("--approval", type=Path, default=None, help="approval file (default attestation.approval)")
    dp.add_argument("--authority-pub", type=Path, default=None,
                    help="authority public key, PEM (default attestation.authority_key)")
    dp.add_argument("--enrollment", type=Path, default=None, metavar="FILE",
                    help="tpm2: the device's enrollment record (`sitsctl enroll --verify -o FILE`); the AK that "
                    "quotes this deployment (the running sitsd's, or the TPM's) must be the enrolled one, else "
                    "[FAIL] and a live load is undone. Default: <audit.directory>/enrollment.json when it exists; "
                    "without a record the AK is trusted on first use (a warning says so)")
    dp.add_argument("--enrollment-authority", type=Path, default=None, metavar="PUB.pem",
                    help="accept the enrollment record only if signed by this P-256 public key "
                    "(`sitsctl enroll --verify --signing-key`); default attestation.enrollment_authority. Without "
                    "either the record's signature is not checked: staged as ak_trust enrolled-unverified, with a "
                    "warning")
    dp.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    dp.add_argument("--json", action="store_true", help="also print the deployment record as JSON (last line)")
    dp.set_defaults(func=_cmd_deploy)

    pol = sub.add_parser("policy", help="the authority's key pair and approvals of a model (PolicyAuthorize)",
                         description="keygen: a P-256 authority key pair for development; approve: sign the PCR "
                         "state a config's model and modules produce, so the device key works for it.")
    psub = pol.add_subparsers(dest="action", required=True, metavar="ACTION")
    kg = psub.add_parser("keygen", help="create authority.key.pem and authority.pub.pem (development)")
    kg.add_argument("--output", type=Path, required=True, help="directory for the key pair")
    kg.set_defaults(func=_cmd_keygen)
    ap = psub.add_parser("approve", help="approve the model and modules of a config")
    ap.add_argument("--authority-key", type=Path, required=True, help="the authority's private key (PEM)")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--output", type=Path, default=Path("approval.json"), help="default ./approval.json")
    ap.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field")
    ap.set_defaults(func=_cmd_approve)


def _cmd_keygen(args) -> int:
    from attestation.tpm.policy import authority_id, generate_authority, load_authority_public

    try:
        priv, pub = generate_authority(args.output)
    except FileExistsError:
        print(f"sitsctl policy keygen: {args.output / 'authority.key.pem'} exists; refusing to overwrite a key",
              file=sys.stderr)
        return 2
    print(f"authority key pair: {priv} (private) and {pub} (public), id {authority_id(load_authority_public(pub))}")
    print(f"WARNING: {priv} is the authority's PRIVATE key. Keep it OFFLINE (air-gapped signing host or HSM); "
          "anyone holding it can approve any model for every device. Copy only the public key to devices.",
          file=sys.stderr)
    return 0


def _cmd_approve(args) -> int:
    from attestation.deploy import split_events
    from attestation.tpm.policy import approve, load_authority_private

    from .cli import parse_overrides
    from .config import load_config
    from .deploy import config_events

    cfg = load_config(args.config, parse_overrides(args.set))
    approved, _ = split_events(config_events(cfg, args.config))
    approval = approve(load_authority_private(args.authority_key), cfg.attestation.measurement_pcr, approved)
    args.output.write_text(approval.to_json())
    print(f"approved model {approval.model_sha256} with {len(approved) - 1} module(s): PCR "
          f"{approval.pcr} = {approval.pcr_value}; written to {args.output}")
    return 0


def _cmd_deploy(args) -> int:
    t0 = time.perf_counter()
    try:
        record = _deploy(args)
    except Fail as exc:
        print(f"Verified: [FAIL] {exc}")
        return 1
    except Exception as exc:  # a defect, not a verdict: still one [FAIL] line, the traceback on stderr
        import traceback

        traceback.print_exc()
        print(f"Verified: [FAIL] internal error ({exc!r}); please report it with the traceback above")
        return 1
    record["deploy_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    ek = [c for c in record.get("ek_certificates", []) if c.get("der")]
    print("EK certificate: " + ("; ".join(f"{c['kind']} at {c['index']} ({c['subject']})" for c in ek) if ek
                                else "none"), file=sys.stderr)
    print(f"staged: {record['staged']} (PCR {record.get('pcr')} = {record.get('pcr_value', 'not measured')}, "
          f"verify on boot: {str(record['verify_on_boot']).lower()}, {record['deploy_ms']} ms)", file=sys.stderr)
    print(OK_LINE.format(device=record["device_id"], model=record["model_sha256"],
                         policy="valid" if record.get("approval") else "none"))
    if args.json:
        print(json.dumps({k: v for k, v in record.items() if k != "approval"}))
    return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(line.strip() for line in text.splitlines()[:3]) if text else type(exc).__name__


def _deploy(args) -> dict:
    from attestation.deploy import (DeployError, measure, measure_software, split_events, verify_record,
                                    write_record)
    from attestation.errors import AttestationError
    from attestation.tpm.policy import Approval, PolicyError, load_authority_public
    from ep.errors import ModelLoadError

    from .cli import parse_overrides
    from .config import load_config
    from .deploy import config_events
    from .errors import ConfigError

    overrides = parse_overrides(args.set)
    if args.tcti:
        overrides["attestation.tcti"] = args.tcti
    if args.attestation_mode in ("tpm2", "software"):
        overrides["attestation.mode"] = args.attestation_mode
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        raise Fail(f"config {args.config} is invalid: {_problem(exc)}") from None
    a = cfg.attestation
    mode = args.attestation_mode or a.mode
    if mode == "none" and args.verify_on_boot:
        raise Fail("--verify-on-boot true needs a measured deployment: --attestation-mode tpm2 (or software)")
    # any signing mode: DeviceID names the device identity key (attestation.key_handle, 0x81000001: the password
    # P-256 key, tpm-direct's signing key), provisioned here when absent; the deployment's device key
    # (attestation.device_key_handle) is policy-bound and signs only the deploy challenge; the config's validation
    # keeps key_handle, ak_handle and device_key_handle apart

    approval_path = Path(args.approval).resolve() if args.approval else a.approval
    authority_path = Path(args.authority_pub).resolve() if args.authority_pub else a.authority_key
    approval = authority = None
    if mode != "none" or approval_path:
        if approval_path is None:
            raise Fail("no approval: pass --approval FILE or set attestation.approval (the authority makes one with "
                       "`sitsctl policy approve`)")
        if authority_path is None:
            raise Fail("no authority public key: pass --authority-pub FILE or set attestation.authority_key")
        try:
            authority = load_authority_public(authority_path)
            approval = Approval.load(approval_path)
            approval.verify(authority)
        except PolicyError as exc:
            raise Fail(f"PolicySig=invalid: {exc.reason}") from None

    try:
        events = config_events(cfg, args.config)
    except ModelLoadError as exc:
        raise Fail(f"model artifact {cfg.model.artifact} does not verify: {_first_line(exc)}") from None
    except Exception as exc:  # WasmError (a module that is not wasm), OSError
        raise Fail(f"cannot measure {args.config}: {_first_line(exc)}") from None
    model_sha = events[0][2]
    if cfg.model.sha256 and cfg.model.sha256 != model_sha:
        raise Fail(f"model artifact SHA-256 {model_sha} differs from model.sha256 {cfg.model.sha256} pinned in "
                   f"{args.config}")
    approved, _ = split_events(events)
    if a.certify_session and mode == "tpm2":
        # sitsd certifies its session key with the config's approval and authority at every start: a deployment
        # under others would verify now and leave a daemon that cannot start
        for given, configured, what in ((approval_path, a.approval, "approval"),
                                        (authority_path, a.authority_key, "authority key")):
            if configured is None or _file_bytes(given) != _file_bytes(configured):
                raise Fail(f"attestation.certify_session is on: sitsd certifies its session key with the config's "
                           f"{what} ({configured}) at every start, and --{'approval' if what == 'approval' else 'authority-pub'} "
                           f"{given} differs from it; put the new {what} into the config (attestation."
                           f"{'approval' if what == 'approval' else 'authority_key'}) and deploy that config")
    if approval is not None:
        if approval.model_sha256 != model_sha:
            raise Fail(f"model artifact SHA-256 {model_sha} is not the approved {approval.model_sha256} (modified "
                       "artifact, or a new model that needs `sitsctl policy approve`)")
        if [tuple(e) for e in approval.events] != approved:
            raise Fail("the config's model name or WASM modules differ from the approved ones (approval events "
                       f"{[e[:2] for e in approval.events]}, config {[e[:2] for e in approved]})")
        if approval.pcr != a.measurement_pcr:
            raise Fail(f"the approval is for PCR {approval.pcr}, attestation.measurement_pcr is {a.measurement_pcr}")
    enrollment = _enrollment(args, cfg, mode)  # before the TPM or the daemon is touched
    nonce = os.urandom(32)
    approval_bytes = approval_path.read_bytes() if approval is not None else b""
    approval_sha = hashlib.sha256(approval_bytes).hexdigest()
    running = _running_daemon(cfg)
    if running is not None and mode != "none":
        return _deploy_live(args, cfg, mode, running, approval, authority, approval_path.name, approval_sha,
                            approved, nonce, enrollment)

    staging = Path(tempfile.mkdtemp(prefix="sits-deploy-"))
    log_path = staging / "measurements.jsonl"
    try:
        trusted_ak = None
        if mode == "tpm2":
            record = _measure_tpm(cfg, events, approval, authority, approval_sha, approval_path, nonce, log_path,
                                  measure)
            if enrollment is not None:
                _check_enrolled_ak(enrollment, record["ak_public_pem"], cfg, "the TPM's AK")
                trusted_ak = enrollment.ak_public_pem
                _note_ak_trust(record, enrollment.trust, enrollment)
            else:
                _note_ak_trust(record, "read-from-tpm", None, record["ak_public_pem"], cfg)
        elif mode == "software":
            print("WARNING: --attestation-mode software: the measurements are replayed in software, no TPM quotes "
                  "or signs them; anyone with write access to audit.directory could forge this record. Development "
                  "only: use tpm2 on a device", file=sys.stderr)
            record = measure_software(pcr=a.measurement_pcr, events=events, approval_sha256=approval_sha,
                                      approval_name=approval_path.name, nonce=nonce, log_path=log_path,
                                      approval=approval)
        else:
            record = {"format": "sits-deployment", "version": 1, "mode": "none", "device_id": "none",
                      "events": [], "nonce": nonce.hex(), "model_sha256": model_sha, "ek_certificates": [],
                      "approval": approval.to_json() if approval is not None else None,
                      "checked_events": [list(e) for e in events]}
        record["verify_on_boot"] = args.verify_on_boot
        record["config"] = str(Path(args.config).resolve())
        if mode == "none":  # checks only: a record without measurements would replace a measured one
            record["staged"] = "nothing (attestation mode none)"
            return record
        verify_record(record, nonce=nonce, authority=authority, ak_public_pem=trusted_ak)
        try:
            record["staged"] = str(write_record(record, Path(cfg.audit.directory), log_path))
        except OSError as exc:
            raise Fail(f"cannot stage the deployment in audit.directory {cfg.audit.directory}: {exc.strerror} (set "
                       "audit.directory to a writable state directory)") from None
        return record
    except PolicyError as exc:
        what = {"refused": "PolicySig=refused by TPM", "key": "device key", "tpm": "TPM"}.get(exc.code,
                                                                                          "PolicySig=invalid")
        raise Fail(f"{what}: {exc.reason}") from None
    except DeployError as exc:
        raise Fail(f"{exc.code}: {exc.reason}") from None
    except AttestationError as exc:
        raise Fail(f"TPM: {_first_line(exc)}") from None
    finally:
        for f in staging.iterdir():
            f.unlink()
        staging.rmdir()


def _file_bytes(path) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except (OSError, TypeError):
        return None


def _problem(exc) -> str:
    field, line, reason = exc.problems[0]
    return f"{field} (line {line}): {reason}" if field else reason


def _measure_tpm(cfg, events, approval, authority, approval_sha, approval_path, nonce, log_path, measure) -> dict:
    from attestation.errors import AttestationError

    from .cli_enroll import bounded_tpm, hang_message

    a = cfg.attestation
    if not a.tcti:
        raise Fail("attestation mode tpm2 needs a TCTI: --tcti, SITS_TCTI or attestation.tcti")
    step = "sitsctl deploy (measuring the deployment in the TPM)"
    from attestation.tpm.worker import TPM_OPEN_TIMEOUT_S

    print(f"sitsctl deploy: measuring in the TPM at {a.tcti} (opening it waits at most {TPM_OPEN_TIMEOUT_S:g} s)",
          file=sys.stderr, flush=True)
    # every TPM call bounded (attestation.tpm.worker): a hung TPM is a [FAIL] naming the step and the TCTI, and
    # nothing is staged; Ctrl-C interrupts the wait
    try:
        with bounded_tpm(a.tcti, step, fail=lambda reason: Fail(f"TPM: {reason.removeprefix('TPM: ')}"),
                         open_prefix="cannot open TCTI") as esapi:
            return measure(esapi, pcr=a.measurement_pcr, events=events, approval=approval, authority=authority,
                           approval_sha256=approval_sha, approval_name=approval_path.name,
                           device_key_handle=a.device_key_handle, identity_key_handle=a.key_handle,
                           ak_handle=a.ak_handle, nonce=nonce, log_path=log_path)
    except AttestationError as exc:  # DeployError and PolicyError included: a hang is named as one
        hung = hang_message(getattr(exc, "step", None) or step, a.tcti, exc)
        if hung is None:
            raise
        raise Fail(f"TPM: {hung}") from None


def _enrollment(args, cfg, mode):
    """The checked enrollment record (attestation.tpm.enroll.Enrollment) that pins the AK, or None: --enrollment,
    else <audit.directory>/enrollment.json when it exists (tpm2 mode only). Its signature is checked with
    --enrollment-authority, else attestation.enrollment_authority of the config; with neither it is not (the
    record is then "enrolled-unverified": a warning says so). Fail when a record is given or installed but does
    not check, or when an authority is configured and there is no record: a damaged or missing pin must never
    fall back to trust on first use."""
    from attestation.tpm.enroll import DEFAULT_RECORD_NAME, EnrollError, EnrollOptionError, load_enrollment_checked

    configured = cfg.attestation.enrollment_authority if mode == "tpm2" else None
    authority_path, authority_option = ((args.enrollment_authority, "--enrollment-authority")
                                        if args.enrollment_authority is not None else
                                        (configured, "attestation.enrollment_authority"))
    path, default = args.enrollment, Path(cfg.audit.directory) / DEFAULT_RECORD_NAME
    if path is None:
        if mode != "tpm2" or not default.exists():
            if args.enrollment_authority is not None:
                raise Fail(f"--enrollment-authority given, but there is no enrollment record to check (no "
                           f"--enrollment and no {default}) in {mode} mode")
            if configured is not None:
                raise Fail(f"attestation.enrollment_authority is set ({configured}), but there is no enrollment "
                           f"record: install the record `sitsctl enroll --verify --signing-key` wrote as {default}, "
                           "or pass --enrollment FILE (a configured enrollment authority never falls back to trust "
                           "on first use)")
            return None
        path = default
    elif mode != "tpm2":
        raise Fail(f"--enrollment pins the TPM's attestation key, and --attestation-mode {mode} quotes with none: "
                   "deploy with --attestation-mode tpm2, or leave --enrollment out")
    try:
        return load_enrollment_checked(path, authority_path=authority_path, authority_option=authority_option)
    except EnrollOptionError as exc:
        raise Fail(exc.reason) from None
    except EnrollError as exc:
        if args.enrollment is None:  # the installed default: say how to get past a stale or old record
            raise Fail(f"{exc.reason} (this is the default record of <audit.directory>: remove or replace {path}, "
                       "or pass --enrollment FILE)") from None
        raise Fail(exc.reason) from None


def _check_enrolled_ak(enrollment, ak_public_pem: str, cfg, whose: str) -> None:
    """Fail unless `ak_public_pem` (what quoted this deployment) is the enrolled AK."""
    from attestation.tpm.enroll import ak_fingerprint

    if enrollment.matches(ak_public_pem):
        return
    handle = cfg.attestation.ak_handle
    hint = ""
    try:
        if enrollment.ak_handle and int(enrollment.ak_handle, 0) != handle:
            hint = (f"; the record enrolled the AK at {enrollment.ak_handle}, the config's attestation.ak_handle is "
                    f"0x{handle:08x}")
    except ValueError:
        pass
    raise Fail(f"ak: {whose} (attestation.ak_handle 0x{handle:08x}, sha256:{ak_fingerprint(ak_public_pem)}…) is not "
               f"the AK enrolled in {enrollment.path} (sha256:{enrollment.ak_fingerprint}…, enrolled "
               f"{enrollment.enrolled_at}): another TPM, or an AK re-created since the enrollment{hint}; if the AK "
               "was replaced on purpose, enroll the device again (docs/enroll.md)")


def _note_ak_trust(record: dict, how: str, enrollment=None, ak_public_pem: str | None = None, cfg=None) -> None:
    """Say (stderr) and record (`ak_trust`) how the AK that quoted this deployment came to be trusted."""
    from attestation.tpm.enroll import DEFAULT_RECORD_NAME, ak_fingerprint

    record["ak_trust"] = how
    if enrollment is not None:
        record["enrollment"] = enrollment.describe()
        print(f"AK: {how} (sha256:{enrollment.ak_fingerprint}…, {enrollment.path}, ek_trust "
              f"{enrollment.ek_trust}{', record signature verified' if enrollment.signature_checked else ''})",
              file=sys.stderr)
        if not enrollment.signature_checked:
            print(f"WARNING: ENROLLMENT RECORD NOT SIGNATURE-CHECKED: no enrollment authority key was given, so "
                  f"{enrollment.path} is trusted for its integrity digest alone, which anyone can recompute: a "
                  "compromised host could have written this record (the default one lies in sitsd's own, "
                  "writable, audit.directory) and named its own AK. Sign the record at enrollment (`sitsctl "
                  "enroll --verify ... --signing-key KEY.pem`) and give its public key (--enrollment-authority "
                  "PUB.pem, or attestation.enrollment_authority in the config)", file=sys.stderr)
        return
    where = f"--enrollment FILE or {Path(cfg.audit.directory) / DEFAULT_RECORD_NAME}"
    fp = ak_fingerprint(ak_public_pem) if ak_public_pem else "?"
    if how == "first-use":
        print(f"WARNING: AK TRUSTED ON FIRST USE: no enrollment record ({where}) and no earlier deployment, so "
              f"the AK the running sitsd reported (sha256:{fp}…) was trusted as reported; a host that fakes its "
              "TPM would pass this check. Enroll the device (`sitsctl enroll`, docs/enroll.md) and deploy with its "
              "record", file=sys.stderr)
    elif how == "previous-deployment":
        print(f"WARNING: AK not enrolled: checked against the AK of the previous deployment (sha256:{fp}…), which "
              f"was itself trusted on first use; no enrollment record ({where}). Enroll the device (`sitsctl "
              "enroll`, docs/enroll.md) to pin it", file=sys.stderr)
    else:
        print(f"note: AK not enrolled: the quote is checked with the AK this TPM reports (sha256:{fp}…); no "
              f"enrollment record ({where}) pins it (`sitsctl enroll`, docs/enroll.md)", file=sys.stderr)


def _running_daemon(cfg) -> dict | None:
    """The status of the sitsd answering on control.socket, or None."""
    from .control import request
    from .errors import ControlError

    try:
        return request(cfg.control.socket, "status", timeout_s=1.0)
    except (ControlError, OSError, ValueError):  # nothing answers there: no daemon
        return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _deploy_live(args, cfg, mode, status, approval, authority, approval_name, approval_sha, approved, nonce,
                 enrollment=None) -> dict:
    """A running sitsd owns the measurement PCR (its hot-swap log), so it loads and measures the checked
    deployment itself (`deploy_verified`), and quotes its log with our nonce; we verify that quote, stage the
    record and confirm (`deploy_commit`). On any failure after the load we ask it to undo the load
    (`deploy_abort`); were we to crash instead, it undoes the load itself after CONFIRM_TIMEOUT_S."""
    from attestation.deploy import RECORD_FILE, DeployError, live_record, load_record, verify_record, write_record

    from .control import request
    from .errors import ControlError

    running_mode = "tpm2" if status.get("signer") == "tpm" else "software"
    if running_mode != mode:
        raise Fail(f"the running sitsd signs in {running_mode} mode, this deployment asks for {mode}: nothing was "
                   "changed (restart sitsd with the deployed config to change modes)")
    try:
        answer = request(cfg.control.socket, "deploy_verified", timeout_s=120.0,
                         config=str(Path(args.config).resolve()), nonce=nonce.hex(),
                         approved_events=[list(e) for e in approved], approval_name=approval_name,
                         approval_sha256=approval_sha, confirm_timeout_s=CONFIRM_TIMEOUT_S)
    except ControlError as exc:
        if str(exc).startswith("sitsd answered:"):  # its answer says whether it restored what it had applied
            raise Fail(f"the running sitsd refused the deployment ({_one_line(exc)})") from None
        raise Fail(f"no answer from the running sitsd ({_one_line(exc)}); whatever it loads without our "
                   f"confirmation it undoes within {CONFIRM_TIMEOUT_S:g} s: check `sitsctl status`") from None
    token = answer.get("token")

    def undo(reason: str) -> str:
        """Ask the daemon to undo the load; the note for the [FAIL] line."""
        if token is None:
            return "the running sitsd cannot undo a load (it has no deploy_abort): check `sitsctl status`"
        try:
            out = request(cfg.control.socket, "deploy_abort", timeout_s=120.0, token=token, reason=reason[:300])
        except ControlError as exc:
            return (f"asking the running sitsd to undo the load failed ({_one_line(exc)}); it undoes it itself "
                    f"{CONFIRM_TIMEOUT_S:g} s after loading it: check `sitsctl status`")
        if out.get("not_restored"):
            return (f"restoring the running configuration FAILED for {', '.join(out['not_restored'])} (rolled back: "
                    f"{', '.join(out.get('restored') or []) or 'nothing'}): check `sitsctl status`")
        if out.get("restored"):
            return "the running configuration was restored"
        return "the running configuration was restored (nothing had been applied)"

    previous = Path(cfg.audit.directory) / RECORD_FILE
    before = previous.read_bytes() if previous.exists() else None
    staged = False
    try:
        trusted = None
        if enrollment is not None:  # the enrolled AK, and no other (docs/enroll.md)
            trusted = enrollment.ak_public_pem.decode()
        elif before is not None:  # the AK of the last verified deployment: the same TPM must answer now
            try:
                trusted = load_record(previous).get("ak_public_pem")
            except DeployError:
                trusted = None
        try:
            record = live_record(answer, nonce=nonce, approval=approval,
                                 device_key_handle=cfg.attestation.device_key_handle,
                                 identity_key_handle=cfg.attestation.key_handle)
            if mode == "tpm2":
                if enrollment is not None:
                    _check_enrolled_ak(enrollment, record["ak_public_pem"], cfg, "the running sitsd's AK")
                    _note_ak_trust(record, enrollment.trust, enrollment)
                else:
                    _note_ak_trust(record, "previous-deployment" if trusted else "first-use", None,
                                   trusted or record["ak_public_pem"], cfg)
            verify_record(record, nonce=nonce, authority=authority,
                          ak_public_pem=trusted.encode() if trusted else None)
        except DeployError as exc:
            raise Fail(f"{exc.code}: {exc.reason}") from None
        record["verify_on_boot"] = args.verify_on_boot
        record["config"] = str(Path(args.config).resolve())
        try:
            record["staged"] = str(write_record(record, Path(cfg.audit.directory), None))
        except OSError as exc:
            raise Fail(f"cannot stage the record in {cfg.audit.directory}: {exc.strerror}") from None
        staged = True
        if token is not None:  # staged first: a confirmed load always has its record
            try:
                request(cfg.control.socket, "deploy_commit", timeout_s=30.0, token=token)
            except ControlError as exc:
                raise Fail(f"the running sitsd did not take the confirmation ({_one_line(exc)})") from None
    except BaseException as exc:  # a failed check, or a defect / Ctrl-C: nothing unverified may keep running
        if staged:
            _restore_file(previous, before)
        note = undo(str(exc) if isinstance(exc, Fail) else f"sitsctl deploy failed: {exc!r}")
        if isinstance(exc, Fail):
            raise Fail(f"{exc}; {note}") from None
        print(f"sitsctl deploy: {note}", file=sys.stderr)
        raise
    print(f"loaded into the running sitsd (applied: {', '.join(record['applied']) or 'nothing, already running'})",
          file=sys.stderr)
    return record


def _restore_file(path: Path, content: bytes | None) -> None:
    """Put back what `path` held (None: it did not exist), by an atomic rename."""
    try:
        if content is None:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_suffix(path.suffix + ".restore")
        tmp.write_bytes(content)
        os.replace(tmp, path)
    except OSError as exc:
        print(f"sitsctl deploy: could not restore {path}: {exc}", file=sys.stderr)
