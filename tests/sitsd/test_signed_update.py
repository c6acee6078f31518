"""attestation.require_signatures against a real sitsd: it starts only with signed modules, model and config;
`sitsctl update` swaps a signed module and refuses unsigned, tampered and foreign-signed ones; a config
reload needs a signed config. The authority key pair is made here (`sitsctl policy keygen`), nothing
private is committed."""
import shutil
import signal
import subprocess
import sys

import yaml

from ..conftest import DEMO_MODEL, REPO, example_config_data, sitsd_args, wait_ready
from .test_hotswap import module_versions

MODULES = REPO / "wasm_modules"


def run_sitsctl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "sitsd.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def signed_config(tmp_path, pub, endpoint, udp_url, modules: dict, audit, control, name="line.yaml"):
    """A copy of the example config (software signer, no OPC UA security, our authority, no example approval)."""
    data = example_config_data()
    model = tmp_path / "rolling_mill.onnx"
    if not model.exists():
        shutil.copy(DEMO_MODEL, model)
    data["model"]["artifact"] = str(model)
    for m in data["modules"]:
        m["path"] = str(modules[m["name"]])
    data["plc"].update(endpoint=endpoint, security="none", pki_dir=str(tmp_path / "pki"))
    data["transport"]["url"] = udp_url
    data["attestation"] = {"mode": "software", "authority_key": str(pub), "require_signatures": "all"}
    data["audit"]["directory"] = str(audit)
    data["control"]["socket"] = str(control)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, model


def test_require_signatures_all_in_a_running_sitsd(plcsim, tmp_path):
    priv, pub = tmp_path / "authority" / "authority.key.pem", tmp_path / "authority" / "authority.pub.pem"
    assert run_sitsctl("policy", "keygen", "--output", tmp_path / "authority").returncode == 0
    other = tmp_path / "other"
    assert run_sitsctl("policy", "keygen", "--output", other).returncode == 0

    def sign(*files, key=priv):
        r = run_sitsctl("sign", "--authority-key", key, *files)
        assert r.returncode == 0, r.stderr

    audit, control = tmp_path / "audit", tmp_path / "c.sock"
    endpoint, udp_url, _ = plcsim(audit / "signer.pub.pem")
    live = tmp_path / "modules"
    live.mkdir()
    for stem in ("pre_filter", "post_command"):
        for suffix in (".wat", ".golden.json"):
            shutil.copy(MODULES / f"{stem}{suffix}", live / f"{stem}{suffix}")
    modules = {"pre_filter": live / "pre_filter.wat", "post_command": live / "post_command.wat"}
    config, model = signed_config(tmp_path, pub, endpoint, udp_url, modules, audit, control)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}

    # an unsigned module: refused at startup, before anything is loaded or any command is signed
    sign(model, config, modules["pre_filter"])
    log = tmp_path / "refused.log"
    r = subprocess.run(sitsd_args(config), stderr=open(log, "wb"), cwd=REPO, env=env, timeout=120)
    text = log.read_text()
    assert r.returncode == 1 and "refusing to start" in text and "post_command.wat" in text and "no signature" in text

    sign(modules["post_command"])
    log = tmp_path / "sitsd.log"
    daemon = subprocess.Popen(sitsd_args(config), stderr=open(log, "wb"), cwd=REPO, env=env)
    pre_v2 = module_versions(tmp_path / "pre", "pre_filter", versions=(2,))[0]
    post_v2, post_v3 = module_versions(tmp_path / "post", "post_command", versions=(2, 3))

    def update(*args):
        return run_sitsctl("update", *args, "--socket", control, env=env)

    try:
        wait_ready(daemon, log)
        sign(pre_v2)
        r = update("--module", pre_v2)
        assert r.returncode == 0 and "swapped module:pre pre_filter" in r.stdout, r.stderr

        r = update("--module", post_v2)  # unsigned
        assert r.returncode == 2 and "refused, the running version stays" in r.stderr
        assert "no signature" in r.stderr and "post_command.wat.sig is missing" in r.stderr

        sign(post_v2, key=other / "authority.key.pem")  # signed, by a key the daemon does not trust
        r = update("--module", post_v2)
        assert r.returncode == 2 and "another key" in r.stderr

        sign(post_v3)
        post_v3.write_text(post_v3.read_text() + "\n;; edited after signing\n")
        r = update("--module", post_v3)
        assert r.returncode == 2 and "changed after it was signed" in r.stderr

        model_v2 = tmp_path / "v2" / "rolling_mill_v2.onnx"
        model_v2.parent.mkdir(exist_ok=True)
        shutil.copy(DEMO_MODEL, model_v2)
        r = update("--model", model_v2)
        assert r.returncode == 2 and "approval does not approve this model" in r.stderr

        # config: an edit of a live section without a new signature is refused; signed, it applies
        edited = config.read_text().replace("max_consecutive_drops: 5", "max_consecutive_drops: 6")
        assert edited != config.read_text()
        config.write_text(edited)
        r = update("--config", config)
        assert r.returncode == 2 and "changed after it was signed" in r.stderr
        r = run_sitsctl("reload", "--socket", control, env=env)
        assert r.returncode == 1 and "changed after it was signed" in r.stderr
        sign(config)
        r = update("--config", config)
        assert r.returncode == 0 and "timing" in r.stdout, r.stderr

        r = run_sitsctl("versions", "--socket", control, "--json", env=env)
        import json

        versions = json.loads(r.stdout)
        assert [h["component"] for h in versions["history"]] == ["module:pre"]
        assert versions["current"]["pre"]["version"] == 2 and versions["current"]["post"]["version"] == 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
