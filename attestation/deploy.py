"""Measured deployment: the measurements `sitsctl deploy` extends into the TPM, the quote over them, the
record it stages for the daemon, and the checks on that record (at deploy time and at boot).

Order of the deployment's measurement log (attestation.measurement), from a reset PCR:

1. the approved part: the model (artifact SHA-256), then the WASM modules in config order. The
   authority's approval names the PCR value these give; the device key signs a deploy challenge
   (SHA-256("sits-deploy-v1" 0 || nonce || PCR value)) only if the TPM finds the PCR in that state;
2. the site part: the config file's bytes, then the approval file's bytes;
3. a TPM2_Quote of the PCR by the AK with the verifier's nonce as extraData.

`verify_record` checks all of it in Python: the quote's signature, nonce and PCR digest, the event log's
replay to the quoted value, the approved prefix against the approval, the approval's signature, and
the device key's signature over the challenge. `verify_boot` is what sitsd runs with verify_on_boot.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from .errors import AttestationError

RECORD_FORMAT = "sits-deployment"
RECORD_FILE = "deployment.json"  # staged next to the audit log (audit.directory)
LOG_FILE = "deployment-measurements.jsonl"
APPROVED_KINDS = ("model", "module:pre", "module:post")
CHALLENGE_LABEL = b"sits-deploy-v1\0"
ZERO = bytes(32)


class DeployError(AttestationError):
    """A deployment that does not verify. `code` (short, stable): event-log, nonce, quote, pcr, model,
    approval, authority, policy, device, record, tpm."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def challenge(nonce: bytes, approved_pcr_value: bytes) -> bytes:
    return hashlib.sha256(CHALLENGE_LABEL + bytes(nonce) + bytes(approved_pcr_value)).digest()


def split_events(events: Sequence[tuple[str, str, str]]) -> tuple[list, list]:
    """(approved prefix, site part): model and modules first, the rest after, order kept."""
    approved = [e for e in events if e[0] in APPROVED_KINDS]
    site = [e for e in events if e[0] not in APPROVED_KINDS]
    return approved, site


def measure(esapi, *, pcr: int, events: Sequence[tuple[str, str, str]], approval, authority, approval_sha256: str,
            approval_name: str, device_key_handle: int, ak_handle: int, nonce: bytes, log_path: Path,
            identity_key_handle: int = 0x81000001) -> dict:
    """The TPM side of a deployment: provision the device identity key (at `identity_key_handle`,
    attestation.key_handle: the password P-256 key DeviceID names, tpm-direct's signing key), the policy-bound
    device key (at `device_key_handle`, attestation.device_key_handle) and the AK when absent, reset
    `pcr`, measure, have the device key sign the challenge under the approval, measure the site part,
    quote. Returns the deployment record (not yet verified: call `verify_record`)."""
    from .measurement import MeasurementLog, TpmPcr
    from .tpm.ek import read_ek_certificates
    from .tpm.policy import key_public_pem, load_or_create_policy_key, policy_sign
    from .tpm.quote import ak_public_pem, load_or_create_ak, quote
    from .tpm.signer import _tss, describe_key, load_or_create_signing_key, password_signing_key_problems

    t = _tss()
    step = f"provisioning the device identity key at 0x{identity_key_handle:08x}"
    try:
        identity, identity_created = load_or_create_signing_key(esapi, identity_key_handle)
        identity_pub, _, _ = esapi.read_public(identity)
        problems = password_signing_key_problems(identity_pub.publicArea)
        if problems:
            raise DeployError(
                f"the key at 0x{identity_key_handle:08x} (attestation.key_handle, the password key DeviceID names) is "
                f"{'; '.join(problems)} (found: {describe_key(identity_pub.publicArea)}); nothing staged. Fix: set "
                f"attestation.key_handle to a free persistent handle (`tpm2_getcap handles-persistent` lists the used "
                f"ones), or evict that key if nothing needs it (`tpm2_evictcontrol -C o -c "
                f"0x{identity_key_handle:08x}`): deploy then provisions a new one", "device identity key")
        identity_pem = identity_pub.to_pem()
        step = f"provisioning the device key at 0x{device_key_handle:08x}"
        key, key_created = load_or_create_policy_key(esapi, device_key_handle, authority)
        step = f"provisioning the attestation key at 0x{ak_handle:08x}"
        ak, ak_created = load_or_create_ak(esapi, ak_handle)
        step = f"resetting PCR {pcr} (only 16 and 23 are resettable at locality 0)"
        esapi.pcr_reset(getattr(t.ESYS_TR, f"PCR{pcr}"))
        step = f"measuring into PCR {pcr}"
        log = MeasurementLog(log_path, pcr, TpmPcr(esapi, pcr))
        if log.initial != ZERO:
            raise DeployError(f"PCR {pcr} is not zero right after its reset", "tpm")
        approved, site = split_events(events)
        for e in approved:
            log.record(*e)
        approved_value = log.value
        step = "the device key signing the deploy challenge (PolicyAuthorize, TPM2_Sign)"
        t0 = time.perf_counter_ns()
        device_sig = policy_sign(esapi, key, approval, authority, challenge(nonce, approved_value))
        policy_sign_ms = (time.perf_counter_ns() - t0) / 1e6
        step = f"measuring into PCR {pcr}"
        for e in site:
            log.record(*e)
        log.record("approval", approval_name, approval_sha256)
        step = "TPM2_Quote"
        q = quote(esapi, ak, [pcr], nonce)
        step = "reading the EK certificates and public keys"
        ek = read_ek_certificates(esapi)
        device_pem, ak_pem = key_public_pem(esapi, key), ak_public_pem(esapi, ak)
    except t.TSS2_Exception as exc:
        raise DeployError(f"TPM: {step} failed: {exc}", "tpm") from exc
    except AttestationError as exc:  # a bounded TPM call that timed out (TpmTimeout), a failed PCR extend
        exc.step = f"sitsctl deploy ({step})"  # the step in progress, for the caller's message
        raise
    return {
        "format": RECORD_FORMAT, "version": 1, "mode": "tpm2", "created_ns": time.time_ns(),
        "device_id": f"TPM2:0x{identity_key_handle:08x}", "identity_key_handle": identity_key_handle,
        "identity_public_pem": identity_pem.decode(),
        "device_key_handle": device_key_handle, "ak_handle": ak_handle,
        "keys_created": [n for n, c in (("device identity key", identity_created), ("device key", key_created),
                                        ("attestation key", ak_created)) if c],
        "pcr": pcr, "initial": log.initial.hex(), "pcr_value": log.value.hex(),
        "events": [asdict(e) for e in log.events], "nonce": bytes(nonce).hex(),
        "quote": {"attest": q.attest.hex(), "signature": q.signature.hex()},
        "ak_public_pem": ak_pem.decode(), "device_public_pem": device_pem.decode(),
        "device_signature": device_sig.hex(), "approval": approval.to_json(), "model_sha256": approval.model_sha256,
        "ek_certificates": [{k: (v.hex() if isinstance(v, bytes) else v) for k, v in c.items()} for c in ek],
        "policy_sign_ms": round(policy_sign_ms, 3),
    }


def measure_software(*, pcr: int, events, approval_sha256: str, approval_name: str, nonce: bytes,
                     log_path: Path, approval=None) -> dict:
    """The same log kept in software (no TPM): evidence only of its own consistency."""
    from .measurement import MeasurementLog

    log = MeasurementLog(log_path, pcr)
    approved, site = split_events(events)
    for e in [*approved, *site]:
        log.record(*e)
    if approval is not None:
        log.record("approval", approval_name, approval_sha256)
    return {"format": RECORD_FORMAT, "version": 1, "mode": "software", "created_ns": time.time_ns(),
            "device_id": "software", "pcr": pcr, "initial": ZERO.hex(), "pcr_value": log.value.hex(),
            "events": [asdict(e) for e in log.events], "nonce": bytes(nonce).hex(),
            "approval": approval.to_json() if approval is not None else None,
            "model_sha256": next(e[2] for e in events if e[0] == "model"), "ek_certificates": []}


def _events_of(record: dict):
    from .measurement import MeasurementEvent

    try:
        return [MeasurementEvent(**e) for e in record["events"]]
    except (KeyError, TypeError) as exc:
        raise DeployError(f"deployment record: malformed events ({exc})", "record") from None


def verify_record(record: dict, *, nonce: bytes, authority=None, ak_public_pem: bytes | None = None) -> None:
    """Everything a verifier checks about a deployment record, in Python. `ak_public_pem`: the AK this
    verifier trusts (default: the record's own, i.e. consistency only). `authority`: the trusted authority
    public key (default: the approval is not checked). Raises DeployError naming the first failure."""
    from .measurement import MeasurementError, event_digest, extend, replay
    from .tpm.policy import Approval, PolicyError, verify_device_signature
    from .tpm.quote import Quote, QuoteError, verify_quote

    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise DeployError("not a deployment record", "record")
    events = _events_of(record)
    try:
        initial = bytes.fromhex(record["initial"])
        value = replay(events, initial)
    except (MeasurementError, ValueError, KeyError) as exc:
        raise DeployError(f"event log does not replay: {exc}", "event-log") from None
    if value.hex() != record.get("pcr_value"):
        raise DeployError("event log replays to another PCR value than the record states", "event-log")
    if record.get("nonce") != bytes(nonce).hex():
        raise DeployError("record was made for another nonce (stale or replayed)", "nonce")
    approval = None
    if record.get("approval"):
        try:
            approval = Approval.from_json(record["approval"], "deployment record approval")
            if authority is not None:
                approval.verify(authority)
        except PolicyError as exc:
            raise DeployError(f"approval: {exc.reason}", "authority" if exc.code == "authority" else "approval") \
                from None
        if record.get("live"):  # a running daemon's log: what it runs now is the last event of each kind
            latest = {}  # a rollback (`rollback:model`, ...) measures the version it made current
            for e in events:
                kind = e.kind.removeprefix("rollback:")
                if kind in APPROVED_KINDS:
                    latest[kind] = (kind, e.name, e.sha256)
            if sorted(latest.values()) != sorted(tuple(e) for e in approval.events):
                raise DeployError(f"the running model/modules {sorted(latest.values())} are not the approved "
                                  f"{sorted(approval.events)}", "model")
        else:
            prefix = ZERO
            for e in events:
                if e.kind not in APPROVED_KINDS:
                    break
                prefix = extend(prefix, event_digest(e.kind, e.name, e.sha256))
            if initial != ZERO or prefix.hex() != approval.pcr_value:
                measured = next((e.sha256 for e in events if e.kind == "model"), "none")
                raise DeployError(f"measured model/modules differ from the approval (model {measured[:16]}…, "
                                  f"approved {approval.model_sha256[:16]}…)", "model")
    if record.get("mode") != "tpm2":
        return
    if approval is None:
        raise DeployError("a tpm2 deployment record carries no approval", "record")
    trusted = ak_public_pem or record["ak_public_pem"].encode()
    try:
        q = Quote(bytes.fromhex(record["quote"]["attest"]), bytes.fromhex(record["quote"]["signature"]),
                  {record["pcr"]: value}, trusted)
        verify_quote(q, trusted, bytes(nonce), {record["pcr"]: value})
    except QuoteError as exc:
        code = {"nonce": "nonce", "pcr-digest": "pcr", "pcr-value": "pcr"}.get(exc.code, "quote")
        raise DeployError(f"quote: {exc.reason}", code) from None
    except (KeyError, ValueError) as exc:
        raise DeployError(f"deployment record: malformed quote ({exc})", "record") from None
    if record.get("live"):
        return  # the device key signs only at a measured deploy (PCR from reset); a live load has the quote
    if not verify_device_signature(record["device_public_pem"].encode(),
                                   challenge(nonce, bytes.fromhex(approval.pcr_value)),
                                   bytes.fromhex(record["device_signature"])):
        raise DeployError("the device key's signature over the deploy challenge does not verify", "device")


def live_record(answer: dict, *, nonce: bytes, approval, device_key_handle: int,
                identity_key_handle: int = 0x81000001) -> dict:
    """The record of a deployment a running daemon loaded (`deploy_verified`'s answer): its whole
    measurement log since start, the quote over it, and `boot_events`, what the next start measures.
    `identity_key_handle` (attestation.key_handle) names the device (DeviceID), whichever key signs the
    daemon's commands."""
    from .measurement import MeasurementError, replay

    events = _events_of(answer)
    try:
        value = replay(events, bytes.fromhex(answer["initial"]))
    except (MeasurementError, ValueError, KeyError) as exc:
        raise DeployError(f"the daemon's event log does not replay: {exc}", "event-log") from None
    if not events or events[-1].kind != "approval":
        raise DeployError("the daemon's log does not end with the approval it was asked to measure", "event-log")
    mode = answer.get("mode")
    record = {"format": RECORD_FORMAT, "version": 1, "mode": mode, "live": True, "created_ns": time.time_ns(),
              "device_id": f"TPM2:0x{identity_key_handle:08x}" if mode == "tpm2" else "software",
              "identity_key_handle": identity_key_handle, "device_key_handle": device_key_handle,
              "pcr": answer["pcr"], "initial": answer["initial"], "pcr_value": value.hex(),
              "events": answer["events"], "boot_events": answer["boot_events"], "nonce": bytes(nonce).hex(),
              "approval": approval.to_json(), "model_sha256": approval.model_sha256, "ek_certificates": [],
              "applied": answer.get("applied", [])}
    if mode == "tpm2":
        if not answer.get("quote"):
            raise DeployError("the daemon runs with a TPM but sent no quote", "quote")
        record.update(quote=answer["quote"], ak_public_pem=answer["ak_public_pem"])
    return record


def write_record(record: dict, directory: Path, log_src: Path | None) -> Path:
    """Stage the verified record (and its measurement log) in `directory`, each by an atomic rename."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / RECORD_FILE
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, target)
    if log_src is not None and Path(log_src).exists():
        os.replace(log_src, directory / LOG_FILE)
    return target


def load_record(path: Path) -> dict:
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DeployError(f"no staged deployment record at {path}: run `sitsctl deploy --config FILE` first",
                          "record") from None
    except (OSError, ValueError) as exc:
        raise DeployError(f"deployment record {path}: unreadable ({exc})", "record") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise DeployError(f"{path} is not a deployment record", "record")
    return record


def verify_boot(record: dict, log, authority=None, ak_handle: int | None = None) -> dict:
    """sitsd with verify_on_boot: `log` is the daemon's MeasurementLog after it measured what it loaded.
    Its events must be the deployment's (model, modules, config), and in tpm2 mode a fresh quote of the
    PCR must verify with the AK that signed the deployment and match the log's replay. Raises DeployError."""
    from .measurement import replay
    from .tpm.quote import QuoteError, verify_quote

    nonce = bytes.fromhex(record.get("nonce", ""))
    expected = ([tuple(e) for e in record["boot_events"]] if record.get("boot_events") else
                [(e["kind"], e["name"], e["sha256"]) for e in record.get("events", []) if e["kind"] != "approval"])
    have = [(e.kind, e.name, e.sha256) for e in log.events]
    if have != expected:
        diff = next(((h, x) for h, x in zip(have, expected) if h != x), (have[len(expected):], expected[len(have):]))
        raise DeployError(f"what sitsd loaded differs from the verified deployment: loaded {diff[0]}, deployed "
                          f"{diff[1]}", "model")
    if authority is None:
        raise DeployError("verify-on-boot needs the authority's public key (attestation.authority_key): without it "
                          "the record's approval cannot be checked, and a record anyone wrote would pass", "authority")
    if not record.get("approval"):
        raise DeployError("the deployment record carries no approval: it verifies nothing; deploy with the "
                          "authority's approval (sitsctl deploy --approval)", "record")
    if record.get("mode") != "tpm2":
        if log.tpm is not None:  # a software record would skip the quote: never for a daemon that has a TPM
            raise DeployError(f"the deployment record was made in {record.get('mode')!r} mode, this daemon measures "
                              "into a TPM: deploy again with --attestation-mode tpm2", "tpm")
        verify_record(record, nonce=nonce, authority=authority)
        return {"mode": record.get("mode"), "events": len(have)}
    if log.tpm is None:
        raise DeployError("the deployment was measured with a TPM, this daemon runs without one", "tpm")
    if log.pcr != record["pcr"]:
        raise DeployError(f"the daemon measures into PCR {log.pcr}, the deployment into PCR {record['pcr']}", "pcr")
    if log.initial not in (ZERO, bytes.fromhex(record["pcr_value"])):
        raise DeployError(f"PCR {log.pcr} was {log.initial.hex()[:16]}… when sitsd started: neither the deployed "
                          "state nor reset; something outside the measurement log extended it", "pcr")
    fresh = os.urandom(32)
    try:
        q, ak_pem = log.tpm.quote(ak_handle if ak_handle is not None else record["ak_handle"], fresh)
    except Exception as exc:  # TSS2_Exception or TpmError: the TPM is not answering
        raise DeployError(f"TPM2_Quote at boot failed: {exc}", "tpm") from exc
    verify_record(record, nonce=nonce, authority=authority, ak_public_pem=ak_pem)  # same TPM, same AK
    try:
        verify_quote(q, ak_pem, fresh, {log.pcr: replay(log.events, log.initial)})
    except QuoteError as exc:
        raise DeployError(f"boot quote: {exc.reason}", "pcr" if exc.code.startswith("pcr") else "quote") from None
    return {"mode": "tpm2", "events": len(have), "pcr": log.pcr, "pcr_value": q.pcrs[log.pcr].hex()}


__all__ = ["DeployError", "LOG_FILE", "RECORD_FILE", "challenge", "live_record", "load_record", "measure",
           "measure_software", "split_events", "verify_boot", "verify_record", "write_record"]
