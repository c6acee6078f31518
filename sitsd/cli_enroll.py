"""`sitsctl enroll`: prove to a verifier that the AK (attestation key) lives in the same TPM as the EK, by
credential activation (attestation/tpm/enroll.py, docs/enroll.md). Four steps, two places:

  device    sitsctl enroll -o request.json                               EK + EK certificate + AK public areas
  verifier  sitsctl enroll --challenge request.json -o challenge.json    checks the AK, encrypts a secret to the
                                                                         EK bound to the AK's Name (keeps it in
                                                                         --pending, default enroll.pending.json)
  device    sitsctl enroll --activate challenge.json -o response.json    TPM2_ActivateCredential
  verifier  sitsctl enroll --verify response.json -o enrollment.json     compares; writes the enrollment record
  anyone    sitsctl enroll --check-record enrollment.json                checks a record as the PLC side does
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import secrets
import sys
from contextlib import contextmanager
from pathlib import Path

REQUEST, CHALLENGE, PENDING, RESPONSE = (f"sits-enroll-{k}/1" for k in ("request", "challenge", "pending", "response"))
RECORD = "sits-enroll-record/2"  # attestation.tpm.enroll.RECORD_FORMAT: with record_sha256 and optional signature
DEFAULT_PENDING = Path("enroll.pending.json")


class Fail(Exception):
    """The step cannot run (exit 2): a missing file, bad JSON, an unreachable TPM."""


class Refused(Exception):
    """The step ran and the answer is no (exit 1): an unfit AK or EK, a failed activation, a wrong secret."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(doc: dict, field: str, where: Path) -> bytes:
    value = doc.get(field)
    try:
        return base64.b64decode(value, validate=True)
    except (TypeError, ValueError):
        raise Fail(f"{where}: field {field!r} must be base64, got {str(value)[:40]!r}") from None


def _read(path: Path, fmt: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise Fail(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise Fail(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise Fail(f"{path} is not a {fmt} document (format {got!r}); did you pass the right file to this step?")
    return doc


def _write(doc: dict, output: Path | None, private: bool = False) -> None:
    text = json.dumps(doc, indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
        return
    output = Path(output)
    tmp = output.with_name(output.name + ".tmp")
    tmp.unlink(missing_ok=True)  # O_CREAT keeps an old file's mode: start afresh for the 0600 secret
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, output)


def _tpm_target(args) -> tuple[str, int]:
    """The TCTI (--tcti / SITS_TCTI, else attestation.tcti of --config) and the AK handle (--ak-handle, else
    attestation.ak_handle of --config, else 0x81000002)."""
    from attestation.tpm.quote import AK_HANDLE

    from .config import CLI_OVERRIDES

    tcti, ak_handle = CLI_OVERRIDES.get("attestation.tcti"), args.ak_handle
    if args.config is not None:
        from .cli import parse_overrides
        from .config import load_config

        cfg = load_config(args.config, parse_overrides(args.set))
        tcti = tcti or cfg.attestation.tcti
        ak_handle = ak_handle if ak_handle is not None else cfg.attestation.ak_handle
    if not tcti:
        raise Fail("which TPM? give --tcti STRING (or SITS_TCTI), e.g. --tcti device:/dev/tpmrm0, or --config with "
                   "attestation.tcti")
    return tcti, AK_HANDLE if ak_handle is None else ak_handle


HANG_FIX = ("it accepted the connection and then did not answer (hung or overloaded): a device: `dmesg | grep -i "
            "tpm`, another client holding it; tpm2-abrmd: `systemctl status tpm2-abrmd`; swtpm: is it running and not "
            "stopped (state T in `ps -o stat`)? Restart it and run the command again")


@contextmanager
def bounded_tpm(tcti: str, step: str, fail=None, open_hint: str = "", open_prefix: str = "cannot open the TPM through TCTI"):
    """The TPM at `tcti` for one CLI step (`sitsctl enroll`, `sitsctl deploy`), every TPM call bounded: opening by
    attestation.tpm.worker.TPM_OPEN_TIMEOUT_S, each call after by TPM_SETUP_TIMEOUT_S (creating a key on a discrete
    TPM may take seconds), both read at call time. The calls run on a TpmWorker thread, so a hung TPM costs `fail`
    (default Fail) naming `step` and the TCTI instead of a CLI blocked forever, and Ctrl-C interrupts the wait.
    Yields an attestation.tpm.worker.BoundedEsapi; a call that times out raises TpmTimeout (a TpmError) from it,
    which the caller turns into its message (`hang_message`). The context is closed when no call is stuck."""
    from attestation.tpm import worker as W
    from attestation.tpm.signer import _tss

    fail = fail or Fail
    worker = W.TpmWorker(tcti)
    try:
        esapi = worker.call("opening the TPM", _tss().ESAPI, tcti, timeout_s=W.TPM_OPEN_TIMEOUT_S)
    except W.TpmTimeout as exc:
        worker.stop()
        raise fail(f"{step}: the TPM behind TCTI {tcti!r} did not answer opening it within "
                   f"{W.TPM_OPEN_TIMEOUT_S:g} s: {HANG_FIX}") from exc
    except BaseException as exc:
        worker.stop()
        if not isinstance(exc, Exception):
            raise  # Ctrl-C
        raise fail(f"{open_prefix} {tcti!r}: {' '.join(str(exc).split()) or type(exc).__name__}"
                   f"{open_hint}") from None
    try:
        yield W.BoundedEsapi(worker, esapi, timeout_s=W.TPM_SETUP_TIMEOUT_S)
    finally:
        worker.abandon(esapi)  # closed on its thread unless a call is stuck there (then left to the exit)


def hang_message(step: str, tcti: str, exc: BaseException) -> str | None:
    """The message for a TPM call of `step` that outlived its bound (a TpmTimeout in `exc`'s chain), else None."""
    from attestation.tpm.worker import timed_out

    if not timed_out(exc):
        return None
    return f"{step}: the TPM behind TCTI {tcti!r} did not answer: {str(exc).strip()}; {HANG_FIX}"


def _open_tpm(tcti: str, step: str):
    return bounded_tpm(tcti, step, open_hint=" (with swtpm, stop sitsd first: it holds the only connection)")


def _tss_exception():
    from attestation.tpm.signer import _tss

    return _tss().TSS2_Exception


# --- device: the request ------------------------------------------------------------------------

def _cmd_request(args) -> dict:
    from attestation.errors import TpmError
    from attestation.tpm import enroll as E
    from attestation.tpm.ek import read_ek_certificates
    from attestation.tpm.quote import load_or_create_ak

    tcti, ak_handle = _tpm_target(args)
    step = "sitsctl enroll (request: reading the AK and EK)"
    try:
        with _open_tpm(tcti, step) as esapi:
            ak, created = load_or_create_ak(esapi, ak_handle)
            ak_public = E.read_public(esapi, ak)
            with E.open_ek(esapi, args.ek) as (_ek, ek_public):
                pass
            wanted = f"0x{E.EK_CERT_INDEX[args.ek]:08x}"
            certs = [c for c in read_ek_certificates(esapi) if c["index"] == wanted and c.get("der")]
    except (TpmError, _tss_exception()) as exc:
        raise Fail(hang_message(step, tcti, exc) or f"TPM at {tcti!r}: {exc}") from None
    cert = E._trim_der(certs[0]["der"]) if certs else None
    print(f"sitsctl enroll: AK 0x{ak_handle:08x} ({'created now' if created else 'existing'}), {args.ek.upper()} EK, "
          f"EK certificate: {'yes' if cert else 'none in NV ' + wanted}", file=sys.stderr)
    return {"format": REQUEST, "ek_kind": args.ek, "ek_public": _b64(ek_public),
            "ek_certificate": _b64(cert) if cert else None, "ak_handle": f"0x{ak_handle:08x}",
            "ak_public": _b64(ak_public),
            "ak_public_pem": E.parse_public(ak_public).public_key_pem().decode()}


# --- verifier: the challenge --------------------------------------------------------------------

def _load_cas(paths: list[Path]):
    from cryptography import x509

    cas = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise Fail(f"cannot read EK CA file {path}: {exc.strerror or exc}") from None
        try:
            pem = b"-----BEGIN" in data
            cas += x509.load_pem_x509_certificates(data) if pem else [x509.load_der_x509_certificate(data)]
        except ValueError as exc:
            raise Fail(f"EK CA file {path} holds no X.509 certificate (PEM or DER): {exc}") from None
    return cas


def _check_ek_trust(args, ek, cert_der: bytes | None) -> str:
    """How the EK is vouched for: 'certificate-chain' (its certificate was issued by an --ek-ca), 'pinned'
    (--expect-ek), 'certificate-unchecked' or 'none' (the record says so)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from attestation.tpm import enroll as E

    if cert_der is not None:
        try:
            matches = E.ek_matches_certificate(ek, cert_der)
        except ValueError as exc:
            raise Refused(f"the request's EK certificate is not an X.509 certificate: {exc}") from None
        if not matches:
            raise Refused("the request's EK certificate certifies another key than the request's EK public area: "
                          "refused (the device sent a certificate that is not its EK's)")
    trust = "certificate-unchecked" if cert_der is not None else "none"
    if args.expect_ek is not None:
        try:
            pinned = serialization.load_pem_public_key(Path(args.expect_ek).read_bytes())
        except (OSError, ValueError) as exc:
            raise Fail(f"--expect-ek {args.expect_ek}: not a readable PEM public key ({exc})") from None
        if pinned.public_bytes(serialization.Encoding.DER,
                               serialization.PublicFormat.SubjectPublicKeyInfo) != ek.public_key_der():
            raise Refused(f"the request's EK is not the one in --expect-ek {args.expect_ek}: another TPM (or a "
                          "replaced one) asks to enroll; refused")
        trust = "pinned"
    if args.ek_ca:
        if cert_der is None:
            raise Refused("--ek-ca given, but the request has no EK certificate (the TPM has none in NV for this EK "
                          "type): cannot check the EK chain; try `sitsctl enroll --ek rsa` on the device, or "
                          "pin the EK with --expect-ek")
        cert = x509.load_der_x509_certificate(E._trim_der(cert_der))
        for ca in _load_cas(args.ek_ca):
            if ca.subject != cert.issuer:
                continue
            try:
                cert.verify_directly_issued_by(ca)
            except Exception:  # InvalidSignature, or a key type / algorithm it cannot check
                continue
            return "certificate-chain"
        raise Refused(f"the EK certificate (issuer {cert.issuer.rfc4514_string() or '(empty)'}) was not issued by "
                      f"any certificate in --ek-ca {' '.join(str(p) for p in args.ek_ca)}: refused. Add the TPM "
                      "manufacturer's intermediate CA certificate")
    if trust in ("none", "certificate-unchecked") and not args.trust_unverified_ek:
        what = ("the request carries an EK certificate, but no --ek-ca was given to check who issued it"
                if trust == "certificate-unchecked" else "the request carries no EK certificate and no --expect-ek "
                "was given")
        raise Refused(f"nothing vouches for this device's EK ({what}; EK public key SHA-256 "
                      f"{hashlib.sha256(ek.public_key_der()).hexdigest()}). Credential activation alone proves only "
                      "that the AK shares a TPM with whatever key the device calls its EK, which a compromised host "
                      "can make up. Give --ek-ca CA.pem (the TPM manufacturer's issuing CA), or --expect-ek EK.pem "
                      "(the EK public key recorded for this device at manufacturing or commissioning), or, to trust "
                      "this EK on first use after comparing the hash above out of band, --trust-unverified-ek (the "
                      f"record then says ek_trust \"{trust}\")")
    return trust


def _cmd_challenge(args) -> dict:
    from attestation.tpm import enroll as E

    req = _read(args.challenge, REQUEST)
    ek_kind = req.get("ek_kind")
    if ek_kind not in ("ecc", "rsa"):
        raise Fail(f"{args.challenge}: ek_kind must be 'ecc' or 'rsa', got {ek_kind!r}")
    ak_public, ek_public = _unb64(req, "ak_public", args.challenge), _unb64(req, "ek_public", args.challenge)
    cert = _unb64(req, "ek_certificate", args.challenge) if req.get("ek_certificate") is not None else None
    try:
        ak = E.parse_public(ak_public, "AK public area")
        E.check_ak(ak)
        ek = E.parse_public(ek_public, "EK public area")
        E.check_ek(ek)
        E.check_ak_usable(ak)
    except E.EnrollError as exc:
        raise Refused(f"{args.challenge}: {exc}") from None
    trust = _check_ek_trust(args, ek, cert)
    ak_name = E.object_name(ak_public)  # computed here from the public area, never taken from the device
    secret = secrets.token_bytes(32)
    blob, encrypted = E.make_credential(ek, ak_name, secret)
    challenge_id = secrets.token_hex(16)
    pending = {"format": PENDING, "challenge_id": challenge_id, "secret": secret.hex(),
               "created_at": _now(), "ek_trust": trust,
               "request_sha256": hashlib.sha256(Path(args.challenge).read_bytes()).hexdigest(),
               "ek_kind": ek_kind, "ek_public": _b64(ek_public), "ek_certificate": _b64(cert) if cert else None,
               "ak_handle": req.get("ak_handle"), "ak_public": _b64(ak_public)}
    _write(pending, args.pending, private=True)
    print(f"sitsctl enroll: challenge {challenge_id} for AK name {ak_name.hex()} ({ek_kind.upper()} EK, EK trust: "
          f"{trust}); the secret is kept in {args.pending}", file=sys.stderr)
    return {"format": CHALLENGE, "challenge_id": challenge_id, "ek_kind": ek_kind, "ak_handle": req.get("ak_handle"),
            "ak_name": ak_name.hex(), "credential_blob": _b64(blob), "encrypted_secret": _b64(encrypted)}


# --- device: activation -------------------------------------------------------------------------

def _cmd_activate(args) -> dict:
    from attestation.errors import TpmError
    from attestation.tpm import enroll as E
    from attestation.tpm.quote import load_or_create_ak

    ch = _read(args.activate, CHALLENGE)
    if ch.get("ek_kind") not in ("ecc", "rsa"):
        raise Fail(f"{args.activate}: ek_kind must be 'ecc' or 'rsa', got {ch.get('ek_kind')!r}")
    blob, encrypted = _unb64(ch, "credential_blob", args.activate), _unb64(ch, "encrypted_secret", args.activate)
    tcti, ak_handle = _tpm_target(args)
    if args.ak_handle is None and args.config is None and ch.get("ak_handle"):
        try:
            ak_handle = int(str(ch["ak_handle"]), 0)
        except ValueError:
            raise Fail(f"{args.activate}: ak_handle {ch['ak_handle']!r} is not a handle like 0x81000002") from None
    step = "sitsctl enroll --activate (TPM2_ActivateCredential)"
    try:
        with _open_tpm(tcti, step) as esapi:
            ak, _ = load_or_create_ak(esapi, ak_handle)
            name = E.object_name(E.read_public(esapi, ak))
            if ch.get("ak_name") and ch["ak_name"] != name.hex():
                raise Refused(f"the challenge was made for AK name {ch['ak_name']}, but the AK at 0x{ak_handle:08x} "
                              f"in this TPM has name {name.hex()}: the AK changed since `sitsctl enroll` (or this is "
                              "another device); run `sitsctl enroll` again and send the new request to the verifier")
            with E.open_ek(esapi, ch["ek_kind"]) as (ek, _):
                secret = E.activate_credential(esapi, ak, ek, blob, encrypted)
    except E.EnrollError as exc:
        raise (Fail if exc.code == "tpm" else Refused)(str(exc)) from None
    except (TpmError, _tss_exception()) as exc:
        raise Fail(hang_message(step, tcti, exc) or f"TPM at {tcti!r}: {exc}") from None
    print(f"sitsctl enroll: credential activated for AK 0x{ak_handle:08x}", file=sys.stderr)
    return {"format": RESPONSE, "challenge_id": ch.get("challenge_id"), "secret": secret.hex()}


# --- verifier: verification and the record ------------------------------------------------------

def _cmd_verify(args) -> dict:
    from attestation.tpm import enroll as E

    resp = _read(args.verify, RESPONSE)
    pending = _read(args.pending, PENDING)
    if resp.get("challenge_id") != pending.get("challenge_id"):
        raise Refused(f"{args.verify} answers challenge {resp.get('challenge_id')}, but {args.pending} is waiting for "
                      f"{pending.get('challenge_id')}: a response to another (older?) challenge; refused")
    try:
        answered = bytes.fromhex(str(resp.get("secret")))
    except ValueError:
        raise Fail(f"{args.verify}: secret must be hex") from None
    try:
        kept = bytes.fromhex(pending["secret"])
        ak_public = base64.b64decode(pending["ak_public"])
        ek_public = base64.b64decode(pending["ek_public"])
        cert = base64.b64decode(pending["ek_certificate"]) if pending.get("ek_certificate") else None
        ak, ek = E.parse_public(ak_public, "AK public area"), E.parse_public(ek_public, "EK public area")
        pending["ek_kind"], pending["ek_trust"]
    except (KeyError, ValueError, TypeError, E.EnrollError) as exc:
        raise Fail(f"{args.pending} is damaged ({exc!r}): run `sitsctl enroll --challenge` again") from None
    signing_key = None
    if args.signing_key is not None:  # before the secret is compared: a bad key must not use up the challenge
        from attestation.tpm.policy import PolicyError, load_authority_private

        try:
            signing_key = load_authority_private(args.signing_key)
        except PolicyError as exc:
            raise Fail(f"--signing-key: {exc.reason.replace('authority', 'enrollment signing')}") from None
    if not E.secret_matches(kept, answered):
        raise Refused("the device answered another secret than the one encrypted to its EK: the AK and the EK are "
                      "not proven to be in the same TPM; refused (no record written)")
    ek_sha = hashlib.sha256(ek.public_key_der()).hexdigest()
    record = {"format": RECORD, "enrolled_at": _now(), "challenge_id": pending["challenge_id"],
              "ak_handle": pending.get("ak_handle"), "ak_name": ak.name().hex(),
              "ak_public_pem": ak.public_key_pem().decode(), "ak_public": pending["ak_public"],
              "ek_kind": pending["ek_kind"], "ek_public": pending["ek_public"], "ek_public_sha256": ek_sha,
              "ek_public_pem": ek.public_key_pem().decode(),
              "ek_certificate_sha256": hashlib.sha256(cert).hexdigest() if cert else None,
              "ek_trust": pending["ek_trust"], "request_sha256": pending.get("request_sha256"),
              # what this verifier checked: the secret it encrypted to this EK, bound to this AK Name, came back
              "activation": {"method": E.ACTIVATION_METHOD, "challenge_id": pending["challenge_id"],
                             "ak_name": ak.name().hex(), "ek_public_sha256": ek_sha,
                             "challenged_at": pending.get("created_at"), "verified_at": _now()}}
    record = E.seal_record(record, signing_key)
    try:
        E.check_enrollment(record, "being written")  # what every reader checks: never write one they would refuse
    except E.EnrollError as exc:
        raise Fail(f"{args.pending}: the record made from it does not check ({exc.reason})") from None
    try:
        os.unlink(args.pending)  # one challenge, one answer
    except OSError:
        pass
    signed = f"signed by {record['signature']['key_id'][:16]}…" if signing_key else "not signed"
    print(f"sitsctl enroll: OK: AK {ak.name().hex()[:20]}… is in the TPM of EK {record['ek_public_sha256'][:16]}… "
          f"(EK trust: {record['ek_trust']}; record {signed})", file=sys.stderr)
    if args.output is not None:
        print(f"sitsctl enroll: give {args.output} to the PLC (`sitsctl plcsim --enrollment`) and install it on the "
              f"device as <audit.directory>/{E.DEFAULT_RECORD_NAME} (or pass `sitsctl deploy --enrollment`)"
              + (", with --enrollment-authority PUB.pem (attestation.enrollment_authority for deploy)"
                 if signing_key else ""), file=sys.stderr)
    if signing_key is None:
        print("sitsctl enroll: WARNING: the record is not signed: anyone who can write it (the device's own sitsd, "
              "for <audit.directory>/enrollment.json) can change its AK and recompute its digest, and readers will "
              "say enrolled-unverified; sign it with --signing-key KEY.pem and give readers the public key",
              file=sys.stderr)
    return record


def _cmd_check_record(args) -> dict:
    """Check a record exactly as the PLC side does (attestation.tpm.enroll.load_enrollment)."""
    from attestation.tpm import enroll as E

    try:
        with open(args.check_record, "rb"):
            pass
    except OSError as exc:
        raise Fail(f"cannot read {args.check_record}: {exc.strerror or exc}") from None
    try:
        enrollment = E.load_enrollment_checked(args.check_record, authority_path=args.enrollment_authority,
                                               min_ek_trust=args.require_ek_trust)
    except E.EnrollOptionError as exc:
        raise Fail(exc.reason) from None
    except E.EnrollError as exc:
        raise Refused(exc.reason) from None
    signature = (f"verified, by {enrollment.signed_by[:16]}…" if enrollment.signature_checked else
                 f"claims key {enrollment.claimed_signed_by[:16]}…, NOT checked: give --enrollment-authority"
                 if enrollment.claimed_signed_by else "none, NOT checked: anyone who can write the file could have "
                 "written it")
    print(f"sitsctl enroll: OK: {args.check_record} enrolls AK {enrollment.ak_name[:20]}… (ek_trust "
          f"{enrollment.ek_trust}; signature {signature})", file=sys.stderr)
    return enrollment.describe()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# option -> (the step it belongs to, that step's option): given with another step it is refused, never ignored
_STEP_OPTIONS = {"signing_key": ("--signing-key", "verify", "--verify"),
                 "trust_unverified_ek": ("--trust-unverified-ek", "challenge", "--challenge"),
                 "ek_ca": ("--ek-ca", "challenge", "--challenge"),
                 "expect_ek": ("--expect-ek", "challenge", "--challenge"),
                 "enrollment_authority": ("--enrollment-authority", "check_record", "--check-record"),
                 "require_ek_trust": ("--require-ek-trust", "check_record", "--check-record")}


def _step_name(args) -> str:
    for name in ("challenge", "activate", "verify", "check_record"):
        if getattr(args, name):
            return name
    return "request"


def _check_step_options(args) -> None:
    step = _step_name(args)
    for dest, (option, wanted, wanted_option) in _STEP_OPTIONS.items():
        if getattr(args, dest) and step != wanted:
            here = "the device's request step (no step option)" if step == "request" else \
                f"--{step.replace('_', '-')}"
            raise Fail(f"{option} goes with {wanted_option}, not with {here}: it would have no effect here; leave "
                       f"it out, or run `sitsctl enroll {wanted_option} ...`")


def _cmd_enroll(args) -> int:
    step = (_cmd_challenge if args.challenge else _cmd_activate if args.activate
            else _cmd_verify if args.verify else _cmd_check_record if args.check_record else _cmd_request)
    try:
        _check_step_options(args)
        doc = step(args)
    except Refused as exc:
        print(f"sitsctl enroll: REFUSED: {exc}", file=sys.stderr)
        return 1
    except Fail as exc:
        print(f"sitsctl enroll: {exc}", file=sys.stderr)
        return 2
    _write(doc, args.output)
    return 0


def _handle(text: str) -> int:
    import argparse

    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a persistent handle like 0x81000002, got {text!r}") from None
    if not 0x81000000 <= value <= 0x81FFFFFF:
        raise argparse.ArgumentTypeError(f"{text} is not a persistent handle (0x81000000..0x81FFFFFF)")
    return value


def register(sub) -> None:
    """Adds `enroll` to sitsctl's subcommands."""
    import argparse

    en = sub.add_parser(
        "enroll", help="prove the AK is in the same TPM as the EK (credential activation): request, challenge, "
        "activate, verify", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__ + """
Without a step option it is the device's first step. The request carries the EK public area, the EK
certificate when the TPM has one in NV, and the AK public area. The verifier refuses an AK that is not a
restricted signing key with fixedTPM and fixedParent, computes the AK's Name itself, and keeps the secret
in --pending (mode 0600; deleted once verified). --challenge refuses an EK nothing vouches for unless
--trust-unverified-ek is given: pass --ek-ca or --expect-ek. The enrollment record binds the AK public key to
the EK public key and certificate hashes and carries an integrity digest (and a signature with --signing-key);
give it to the PLC (`sitsctl plcsim --enrollment FILE`) and to `sitsctl deploy` (--enrollment FILE, or
<audit.directory>/enrollment.json on the device): they then trust that AK only, never one on first use.
Readers check the signature only when given the signer's public key (--enrollment-authority; deploy also
attestation.enrollment_authority); otherwise the record is only as trustworthy as whoever could write it.
The TPM: --tcti STRING (or SITS_TCTI), else attestation.tcti of --config. Exit status: 0 done, 1 refused
(says why), 2 could not run. See docs/enroll.md.""")
    step = en.add_mutually_exclusive_group()
    step.add_argument("--challenge", type=Path, metavar="REQUEST.json",
                      help="verifier: check a device's request and write the challenge (no TPM needed)")
    step.add_argument("--activate", type=Path, metavar="CHALLENGE.json",
                      help="device: activate the credential in the TPM and write the response")
    step.add_argument("--verify", type=Path, metavar="RESPONSE.json",
                      help="verifier: compare the response with the kept secret and write the enrollment record")
    step.add_argument("--check-record", type=Path, metavar="ENROLLMENT.json",
                      help="anyone: check an enrollment record as the PLC side does (digest, signature with "
                      "--enrollment-authority, AK and EK, --require-ek-trust); exit 0 and a summary when it passes")
    en.add_argument("-o", "--output", type=Path, default=None,
                    help="where this step writes its JSON (default: stdout)")
    en.add_argument("--pending", type=Path, default=DEFAULT_PENDING,
                    help="verifier: the kept secret, written by --challenge, read by --verify "
                    f"(default {DEFAULT_PENDING})")
    en.add_argument("--ek", choices=("ecc", "rsa"), default="ecc",
                    help="device request: the EK type, TCG default template ecc (P-256) or rsa (RSA 2048); "
                    "default ecc")
    en.add_argument("--ak-handle", type=_handle, default=None,
                    help="device: the AK's persistent handle (default attestation.ak_handle of --config, or "
                    "0x81000002); created when absent")
    en.add_argument("--config", type=Path, default=None, help="device: sitsd config for attestation.tcti and ak_handle")
    en.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a --config field")
    en.add_argument("--ek-ca", type=Path, action="append", default=[], metavar="CA.pem",
                    help="verifier --challenge: trusted EK issuer certificates (PEM bundle or DER; repeatable); the "
                    "EK certificate must be issued by one of them")
    en.add_argument("--expect-ek", type=Path, default=None, metavar="EK.pem",
                    help="verifier --challenge: the EK public key recorded for this device (PEM); refuse any other")
    en.add_argument("--trust-unverified-ek", action="store_true",
                    help="verifier --challenge: without --ek-ca or --expect-ek, enroll anyway and trust the EK on "
                    "first use (recorded as ek_trust none or certificate-unchecked). Without it such a challenge "
                    "is refused: nothing would show the EK is a real TPM's")
    en.add_argument("--signing-key", type=Path, default=None, metavar="KEY.pem",
                    help="verifier --verify: sign the enrollment record with this P-256 private key (PEM; make "
                    "one with `sitsctl policy keygen`); readers given its public key refuse unsigned or altered "
                    "records")
    en.add_argument("--enrollment-authority", type=Path, default=None, metavar="PUB.pem",
                    help="--check-record: require the record's signature by this public key (without it the "
                    "signature is not checked, and the record is only as trustworthy as whoever could write it)")
    en.add_argument("--require-ek-trust", default=None, choices=("certificate-chain", "pinned",
                                                                  "certificate-unchecked", "none"),
                    help="--check-record: the weakest ek_trust accepted (strongest first: certificate-chain, "
                    "pinned, certificate-unchecked, none); default any. A level above none needs "
                    "--enrollment-authority (ek_trust is a field of the record: only its signature protects it)")
    en.set_defaults(func=_cmd_enroll)
