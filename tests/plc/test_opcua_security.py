"""Basic256Sha256 between sitsd and the simulator: trust lists both ways, and errors that say which file to move."""
import shutil
import subprocess

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
