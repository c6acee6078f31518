"""OPC UA application certificates and trust lists (Basic256Sha256, Sign or SignAndEncrypt).

PKI directory layout, as OPC UA stacks use it:
    own/cert.der, own/private/key.pem   this application's certificate and RSA key
    trusted/certs/                      peer certificates (or their CAs) that are trusted
    rejected/certs/                     peer certificates that were refused, saved for review
An operator trusts a rejected peer by moving its file from rejected/certs to trusted/certs.
The trust list is re-read on every connection attempt, so that takes effect without a restart.

The daemon runs as its own user and writes rejected/certs itself; `sitsctl pki` runs as root and hands
what it creates to that user (`Pki.hand_over`), so that the key (0600) stays readable by the daemon.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from asyncua import ua
from asyncua.common.utils import ServiceError
from asyncua.crypto import cert_gen
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256
from asyncua.crypto.truststore import TrustStore
from asyncua.crypto.validator import CertificateValidator, CertificateValidatorOptions
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import PlcError

SECURITY_POLICY = SecurityPolicyBasic256Sha256
SECURITY_MODES = {"sign": ua.MessageSecurityMode.Sign, "sign-and-encrypt": ua.MessageSecurityMode.SignAndEncrypt}
SERVER_POLICIES = {"sign": ua.SecurityPolicyType.Basic256Sha256_Sign,
                   "sign-and-encrypt": ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt}


class CertificateError(PlcError):
    """A certificate is missing, unreadable, or was refused by one side; the message says which and what to do."""


def thumbprint(cert: x509.Certificate) -> str:
    """SHA-1 of the DER, the thumbprint OPC UA tools show."""
    return hashlib.sha1(cert.public_bytes(serialization.Encoding.DER)).hexdigest()  # noqa: S324 - identifier only


def subject_cn(cert: x509.Certificate) -> str:
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else cert.subject.rfc4514_string()


@dataclass(frozen=True)
class Pki:
    root: Path

    @property
    def own_cert(self) -> Path:
        return self.root / "own" / "cert.der"

    @property
    def own_key(self) -> Path:
        return self.root / "own" / "private" / "key.pem"

    @property
    def trusted(self) -> Path:
        return self.root / "trusted" / "certs"

    @property
    def rejected(self) -> Path:
        return self.root / "rejected" / "certs"

    def has_own(self) -> bool:
        return self.own_cert.is_file() and self.own_key.is_file()

    def load_own(self) -> x509.Certificate:
        try:
            return x509.load_der_x509_certificate(self.own_cert.read_bytes())
        except (OSError, ValueError) as exc:
            raise CertificateError(f"cannot read this application's certificate {self.own_cert}: {exc}") from exc

    def create_own(self, application_uri: str, common_name: str, server: bool,
                   hostnames: list[str] | None = None, ips: list[str] | None = None, days: int = 3650) -> x509.Certificate:
        """Generate an RSA-2048 key and a self-signed application certificate (OPC 10000-6 6.2.2)."""
        import ipaddress

        key = cert_gen.generate_private_key()
        names = [x509.UniformResourceIdentifier(application_uri)]
        names += [x509.DNSName(h) for h in (hostnames or [socket.gethostname()])]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in (ips or [])]
        usage = [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = cert_gen.generate_self_signed_app_certificate(key, common_name, {}, names, usage, days=days)
        for d in (self.own_key.parent, self.trusted, self.rejected):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.own_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(cert_gen.dump_private_key_as_pem(key))
        self.own_cert.write_bytes(cert.public_bytes(serialization.Encoding.DER))
        return cert

    def hand_over(self, uid: int, gid: int) -> list[Path]:
        """Give the whole PKI tree (the root, own/, the key, the trust and reject lists) to uid:gid, so that
        a daemon running as that user can read its key and save refused certificates. Symbolic links are
        changed themselves, never followed. Returns the paths whose owner or group changed."""
        changed: list[Path] = []
        if not self.root.exists():
            return changed
        paths = [self.root]
        for dirpath, dirnames, filenames in os.walk(self.root):
            paths += [Path(dirpath, n) for n in dirnames + filenames]
        for path in paths:
            st = path.lstat()
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.chown(path, uid, gid, follow_symlinks=False)
                changed.append(path)
        return changed

    def trust(self, cert: x509.Certificate) -> Path:
        self.trusted.mkdir(parents=True, exist_ok=True)
        path = self.trusted / _file_name(cert)
        path.write_bytes(cert.public_bytes(serialization.Encoding.DER))
        return path

    def is_trusted(self, cert: x509.Certificate) -> bool:
        """Exactly this certificate is in the trust list (the usual case for self-signed PLC certificates)."""
        der = cert.public_bytes(serialization.Encoding.DER)
        if not self.trusted.is_dir():
            return False
        for path in self.trusted.iterdir():
            try:
                data = path.read_bytes()
                other = x509.load_der_x509_certificate(data) if not data.startswith(b"-----") \
                    else x509.load_pem_x509_certificate(data)
            except (OSError, ValueError):
                continue
            if other.public_bytes(serialization.Encoding.DER) == der:
                return True
        return False


def _file_name(cert: x509.Certificate) -> str:
    cn = re.sub(r"[^A-Za-z0-9_.-]+", "_", subject_cn(cert))[:40]
    return f"{cn} [{thumbprint(cert)}].der"


class TrustListValidator:
    """Validates a peer certificate: time range, application URI, key usage for its role, and trust.

    Trust: the certificate itself is in the trust list, or it chains to a CA that is (asyncua's
    TrustStore). A refused certificate is saved into rejected/certs and remembered in
    `last_rejected` so the caller can say exactly which file to move.
    """

    def __init__(self, pki: Pki, peer_is_server: bool) -> None:
        self.pki = pki
        role = CertificateValidatorOptions.PEER_SERVER if peer_is_server else CertificateValidatorOptions.PEER_CLIENT
        options = (CertificateValidatorOptions.TIME_RANGE | CertificateValidatorOptions.URI
                   | CertificateValidatorOptions.EXT_KEY_USAGE | role)
        self._checks = CertificateValidator(options)
        self.last_rejected: tuple[Path, x509.Certificate, str] | None = None

    async def __call__(self, cert: x509.Certificate, app_description: ua.ApplicationDescription) -> None:
        try:
            await self._validate(cert, app_description)
        except ServiceError:
            raise
        except Exception as exc:  # fail closed: asyncua lets a session through on other exception types
            self._reject(cert, f"BadCertificateInvalid ({exc})")
            raise ServiceError(ua.StatusCodes.BadCertificateInvalid) from exc

    async def _validate(self, cert: x509.Certificate, app_description: ua.ApplicationDescription) -> None:
        try:
            await self._checks.validate(cert, app_description)
        except ServiceError as exc:
            self._reject(cert, ua.StatusCode(exc.code).name)
            raise
        if self.pki.is_trusted(cert):
            return
        if self.pki.trusted.is_dir() and any(self.pki.trusted.iterdir()):
            try:  # a CA in the trust list that issued this certificate
                store = TrustStore([self.pki.trusted], [])
                await store.load()
                if store.is_trusted(cert):
                    return
            except ValueError:  # no CA certificate in the list: nothing can chain to it
                pass
        self._reject(cert, "BadCertificateUntrusted")
        raise ServiceError(ua.StatusCodes.BadCertificateUntrusted)

    def _reject(self, cert: x509.Certificate, reason: str) -> None:
        self.pki.rejected.mkdir(parents=True, exist_ok=True)
        path = self.pki.rejected / _file_name(cert)
        path.write_bytes(cert.public_bytes(serialization.Encoding.DER))
        self.last_rejected = (path, cert, reason)

    def explain(self) -> str:
        if self.last_rejected is None:
            return ""
        path, cert, reason = self.last_rejected
        return (f"certificate CN={subject_cn(cert)} (SHA-1 {thumbprint(cert)}) refused: {reason}; saved to {path}"
                + (f"\n  fix: if you trust it, move it into {self.pki.trusted}" if reason == "BadCertificateUntrusted"
                   else ""))
