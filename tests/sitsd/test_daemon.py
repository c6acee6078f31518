"""sitsd as a process: startup refusals say what is wrong and how to fix it."""
import subprocess

from attestation.signers import SoftwareSigner

from ..conftest import EXAMPLE_CONFIG, REPO, sitsd_args


def test_plc_that_does_not_trust_the_key_refuses_startup(plcsim, tmp_path):
    other_key = tmp_path / "other.pem"
    other_key.write_bytes(SoftwareSigner().public_key_pem())
    endpoint, udp_url, _ = plcsim(other_key)
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, plc__endpoint=endpoint, transport__url=udp_url,
                                  attestation__mode="software", audit__directory=tmp_path / "audit",
                                  control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert "refused the startup fail-safe command" in r.stderr
    assert "signer.pub.pem" in r.stderr


def test_unreachable_plc_is_a_startup_error(tmp_path):
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, plc__endpoint="opc.tcp://127.0.0.1:9/none",
                                  plc__timeout_s=1, attestation__mode="software",
                                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert "cannot connect to the PLC at opc.tcp://127.0.0.1:9/none" in r.stderr


def test_unreachable_tpm_is_a_startup_error_not_a_downgrade(tmp_path):
    r = subprocess.run(sitsd_args(EXAMPLE_CONFIG, attestation__tcti=f"swtpm:path={tmp_path}/no.sock",
                                  audit__directory=tmp_path / "audit", control__socket=tmp_path / "c.sock"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert "cannot open TPM through TCTI" in r.stderr and "attestation.mode: software" in r.stderr


def test_bad_config_exits_2_with_file_line_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE_CONFIG.read_text().replace("publisher_id: 7", "publisher_id: seven"))
    r = subprocess.run(sitsd_args(bad), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2
    assert f"{bad}:" in r.stderr and "transport.publisher_id" in r.stderr
