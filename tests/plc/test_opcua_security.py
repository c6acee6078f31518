"""Basic256Sha256 between sitsd and the simulator: trust lists both ways, and errors that say which file to move."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cryptography import x509

from plc.opcua_security import Pki, thumbprint

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args, wait_ready


@pytest.fixture
def pkis(tmp_path):
    client, server = Pki(tmp_path / "pki-sitsd"), Pki(tmp_path / "pki-plc")
    client_cert = client.create_own("urn:sits2026:sitsd", "sitsd test", server=False)
    server_cert = server.create_own("urn:sits2026:plc-simulator", "plc test", server=True, ips=["127.0.0.1"])
    return client, server, client_cert, server_cert


def _run_sitsd(tmp_path, endpoint, udp_url, client: Pki, timeout=60):
    return subprocess.run(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                     attestation__mode="software", plc__security="sign-and-encrypt",
                                     plc__pki_dir=client.root, audit__directory=tmp_path / "audit",
                                     control__socket=tmp_path / "c.sock", plc__timeout_s=2),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_untrusted_plc_certificate_is_saved_and_named(plcsim, pkis, tmp_path):
    client, server, client_cert, server_cert = pkis
    server.trust(client_cert)  # the PLC trusts us, we do not trust it yet
    endpoint, udp_url, _ = plcsim(tmp_path / "audit" / "signer.pub.pem", security="sign-and-encrypt",
                                  pki=server.root)
    r = _run_sitsd(tmp_path, endpoint, udp_url, client)
    assert r.returncode == 1
    assert f"SHA-1 {thumbprint(server_cert)}" in r.stderr and "BadCertificateUntrusted" in r.stderr
    (rejected,) = client.rejected.iterdir()
    assert x509.load_der_x509_certificate(rejected.read_bytes()) == server_cert
    assert f"move it into {client.trusted}" in r.stderr


def test_plc_refusing_our_certificate_is_explained(plcsim, pkis, tmp_path):
    client, server, client_cert, server_cert = pkis
    client.trust(server_cert)  # we trust the PLC, it does not trust us
    endpoint, udp_url, _ = plcsim(tmp_path / "audit" / "signer.pub.pem", security="sign-and-encrypt",
                                  pki=server.root)
    r = _run_sitsd(tmp_path, endpoint, udp_url, client)
    assert r.returncode == 1
    assert "refused this client's certificate" in r.stderr
    assert f"add {client.own_cert} to the PLC's trusted certificates" in r.stderr


def test_missing_client_certificate_points_to_pki_init(tmp_path):
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, attestation__mode="software", plc__pki_dir=tmp_path / "none",
                                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1 and "sitsctl pki init" in r.stderr


def test_secure_plc_refuses_an_unsecured_client(plcsim, pkis, tmp_path):
    import asyncio

    from asyncua import Client

    client, server, client_cert, _ = pkis
    endpoint, _, _ = plcsim(tmp_path / "k.pem", security="sign-and-encrypt", pki=server.root)

    async def plain():
        c = Client(endpoint, timeout=2)
        try:
            await c.connect()
        finally:
            try:
                await c.disconnect()
            except Exception:
                pass

    with pytest.raises(Exception):  # no None endpoint: an unsecured session is never opened
        asyncio.run(plain())


def test_moving_the_rejected_certificate_into_the_trust_list_fixes_it(plcsim, pkis, tmp_path):

    client, server, client_cert, server_cert = pkis
    server.trust(client_cert)
    endpoint, udp_url, _ = plcsim(tmp_path / "audit" / "signer.pub.pem", security="sign-and-encrypt",
                                  pki=server.root)
    assert _run_sitsd(tmp_path, endpoint, udp_url, client).returncode == 1
    (rejected,) = client.rejected.iterdir()
    shutil.move(rejected, client.trusted / rejected.name)  # what the error message tells an operator to do
    proc = subprocess.Popen(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                       attestation__mode="software", plc__security="sign-and-encrypt",
                                       plc__pki_dir=client.root, audit__directory=tmp_path / "audit",
                                       control__socket=tmp_path / "c.sock"),
                            stderr=open(tmp_path / "log", "wb"), cwd=REPO)
    try:
        wait_ready(proc, tmp_path / "log")
    finally:
        proc.terminate()
        proc.wait(20)


# sitsctl pki runs as root on the device; the daemon runs as its own user (systemd User=sitsd) and must read
# the key (0600) and write rejected/certs. CI runs as root: there the files go to `nobody`, a user that
# exists on every Debian machine, and the checks read and write as that user (setpriv). Without root, the
# same code path gives the files to the current user.

def _daemon_like_user() -> tuple[str, int, int]:
    import pwd

    pw = pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    return pw.pw_name, pw.pw_uid, pw.pw_gid


@pytest.fixture
def open_dir():
    """A directory any user can reach (pytest's tmp_path is 0700 root: `nobody` could not get in)."""
    path = Path(tempfile.mkdtemp(prefix="sits-pki-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def _sitsctl_pki(capsys, *args: str) -> tuple[int, str]:
    from sitsd.cli import main

    try:
        rc = main(["pki", *args])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 2
        print(exc.code)
    return rc, capsys.readouterr().out


def _as_user(uid: int, gid: int, code: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_pki_init_hands_the_pki_to_the_daemon_user(capsys, open_dir):
    name, uid, gid = _daemon_like_user()
    root = open_dir / "pki"
    rc, out = _sitsctl_pki(capsys, "init", "--config", str(EXAMPLE_CONFIG), "--set", f"plc.pki_dir={root}",
                           "--owner", name)
    assert rc == 0, out
    assert f"belong to {name} (uid {uid}, gid {gid})" in out
    pki = Pki(root)
    tree = [root, *root.rglob("*")]
    assert pki.own_key in tree and pki.rejected in tree and pki.trusted in tree
    assert all((p.lstat().st_uid, p.lstat().st_gid) == (uid, gid) for p in tree), \
        [(str(p), p.lstat().st_uid, p.lstat().st_gid) for p in tree]
    assert pki.own_key.stat().st_mode & 0o777 == 0o600  # still private to the daemon's user
    # what the daemon does with it: load its key, save a refused certificate
    r = _as_user(uid, gid, f"from pathlib import Path; Path({str(pki.own_key)!r}).read_bytes(); "
                           f"Path({str(pki.rejected / 'x.der')!r}).write_bytes(b'x')")
    assert r.returncode == 0, r.stderr


def test_pki_init_repairs_the_owner_of_an_existing_pki(capsys, open_dir):
    """A PKI made before (as root, without --owner) is handed over by running init again, key unchanged."""
    name, uid, gid = _daemon_like_user()
    root = open_dir / "pki"
    Pki(root).create_own("urn:sits2026:sitsd", "sitsd test", server=False)
    key = Pki(root).own_key.read_bytes()
    rc, out = _sitsctl_pki(capsys, "init", "--config", str(EXAMPLE_CONFIG), "--set", f"plc.pki_dir={root}",
                           "--owner", name)
    assert rc == 0 and "exists" in out and f"belong to {name}" in out, out
    assert Pki(root).own_key.read_bytes() == key
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in [root, *root.rglob("*")]} == {(uid, gid)}


def test_pki_trust_hands_the_trusted_certificate_over(capsys, open_dir, tmp_path):
    from cryptography.hazmat.primitives import serialization

    name, uid, gid = _daemon_like_user()
    plc_cert = Pki(tmp_path / "plc").create_own("urn:sits2026:plc-simulator", "plc test", server=True)
    pem = tmp_path / "plc.pem"
    pem.write_bytes(plc_cert.public_bytes(serialization.Encoding.PEM))
    root = open_dir / "pki"
    rc, out = _sitsctl_pki(capsys, "trust", str(pem), "--config", str(EXAMPLE_CONFIG),
                           "--set", f"plc.pki_dir={root}", "--owner", name)
    assert rc == 0 and f"SHA-1 {thumbprint(plc_cert)}" in out, out
    (trusted,) = Pki(root).trusted.iterdir()
    assert (trusted.stat().st_uid, trusted.stat().st_gid) == (uid, gid)
    assert Pki(root).is_trusted(plc_cert)


def test_pki_without_a_daemon_user_keeps_the_owner_and_says_so(capsys, open_dir):
    """No --owner: the files go to the user sitsd where it exists (the image); elsewhere they keep their
    owner and sitsctl says so instead of failing."""
    import pwd

    root = open_dir / "pki"
    rc, out = _sitsctl_pki(capsys, "init", "--config", str(EXAMPLE_CONFIG), "--set", f"plc.pki_dir={root}")
    assert rc == 0, out
    try:
        daemon = pwd.getpwnam("sitsd")
    except KeyError:
        assert "there is no user sitsd" in out and "--owner USER" in out
        assert {p.lstat().st_uid for p in [root, *root.rglob("*")]} == {os.geteuid()}
    else:
        assert {p.lstat().st_uid for p in [root, *root.rglob("*")]} == {daemon.pw_uid}


def test_pki_with_an_unknown_owner_writes_nothing(capsys, open_dir):
    root = open_dir / "pki"
    rc, out = _sitsctl_pki(capsys, "init", "--config", str(EXAMPLE_CONFIG), "--set", f"plc.pki_dir={root}",
                           "--owner", "no-such-user-sits2026")
    assert rc != 0 and "no user 'no-such-user-sits2026'" in out
    assert not root.exists()
