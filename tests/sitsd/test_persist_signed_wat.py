"""A persisted hot-swapped `.wat` under attestation.require_signatures (sitsd/persist.py): its signature covers
the file's text bytes (as at startup and in a hot swap), not the wasm SHA-256 the state file records, so a
signed one restores at the next start; one edited after it was signed (a comment: the same wasm) is still
refused, and the alert says the file changed after it was signed. Runs `Persistence.restore` and
`keep_fallback` (what `Daemon._build` calls) on a real config, state file, authority key and WASM host."""
import hashlib
import shutil
from collections import deque
from types import SimpleNamespace

import pytest
import yaml

from ..conftest import DEMO_MODEL, REPO, example_config_data

MODULES = REPO / "wasm_modules"


def version_2(directory, stem: str):
    """A copy of a demo module whose `version` export says 2 (another wasm SHA-256, the same outputs: its golden
    vectors are the module's own), in a directory of its own under the same file name."""
    marker = "(global $version i32 (i32.const 1))"
    src = (MODULES / f"{stem}.wat").read_text()
    assert marker in src
    directory.mkdir(parents=True)
    (directory / f"{stem}.wat").write_text(src.replace(marker, "(global $version i32 (i32.const 2))"))
    shutil.copy(MODULES / f"{stem}.golden.json", directory / f"{stem}.golden.json")
    return directory / f"{stem}.wat"


class Log:
    """The daemon's structlog calls, kept: (level, message, fields)."""

    def __init__(self):
        self.lines = []

    def __getattr__(self, level):
        return lambda message, **fields: self.lines.append((level, message, fields))


def wasm_sha256(path) -> str:
    from sitsd.wasm import read_source

    return hashlib.sha256(read_source(path)).hexdigest()


@pytest.fixture
def line(tmp_path, monkeypatch):
    """A config with require_signatures: modules (its modules signed, copies next to it), and a signed
    pre_filter v2 persisted as the running set by an earlier run. Yields (daemon-like, config, pre_v2, sign)."""
    from attestation.signatures import sign, write
    from attestation.tpm.policy import generate_authority, load_authority_private
    from sitsd.config import load_config
    from sitsd.persist import FORMAT, STATE_FILE, config_entries, overrides_sha256, write_atomic

    for var in ("CACHE_DIRECTORY", "STATE_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # WasmHost()'s .cwasm cache
    priv, pub = generate_authority(tmp_path / "authority")
    key = load_authority_private(priv)

    def sign_module(path):
        write(sign(key, path, "module"), path)

    live = tmp_path / "modules"
    live.mkdir()
    modules = {}
    for stem in ("pre_filter", "post_command"):
        for suffix in (".wat", ".golden.json"):
            shutil.copy(MODULES / f"{stem}{suffix}", live / f"{stem}{suffix}")
        modules[stem] = live / f"{stem}.wat"
        sign_module(modules[stem])
    data = example_config_data()
    data["model"]["artifact"] = str(DEMO_MODEL)
    for m in data["modules"]:
        m["path"] = str(modules[m["name"]])
    data["attestation"] = {"mode": "software", "authority_key": str(pub), "require_signatures": "modules"}
    data["audit"]["directory"] = str(tmp_path / "audit")
    data["control"]["socket"] = str(tmp_path / "c.sock")
    config = tmp_path / "line.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(config)
    (tmp_path / "audit").mkdir()

    pre_v2 = version_2(tmp_path / "pre" / "v2", "pre_filter")
    sign_module(pre_v2)
    entries = config_entries(cfg)
    for m in entries["modules"]:
        if m["name"] == "pre_filter":
            m.update(path=str(pre_v2), sha256=wasm_sha256(pre_v2))  # what set_entries records: the wasm's hash
    write_atomic(tmp_path / "audit" / STATE_FILE, {
        "format": FORMAT, "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "config_path": str(config), "overrides_sha256": overrides_sha256(None), "written": "earlier",
        "reason": "pre_filter v2 passed its health watch", **entries})
    daemon = SimpleNamespace(cfg=cfg, config_path=config, config_overrides=None, config_sha256_at_start=None,
                             log=Log(), alerts=deque())
    yield daemon, modules, pre_v2


def test_a_persisted_signed_wat_restores_and_keeps_the_signed_config_version_as_rollback_target(line):
    from sitsd.persist import Persistence

    daemon, modules, pre_v2 = line
    assert wasm_sha256(pre_v2) != hashlib.sha256(pre_v2.read_bytes()).hexdigest()  # the two hashes differ
    persistence = Persistence(daemon)
    restored = persistence.restore()
    assert restored is not None, (persistence.startup_note, daemon.log.lines)
    host, pre, post = restored.modules
    try:
        assert persistence.loaded_from == "persisted" and not daemon.alerts
        assert pre.path == pre_v2 and pre.version == 2 and pre.sha256 == wasm_sha256(pre_v2)
        assert post.path == modules["post_command"] and post.version == 1  # the whole set loads, signed

        kept = {}
        hotswap = SimpleNamespace(keep_fallback=lambda label, **changes: kept.update(changes))
        persistence.keep_fallback(hotswap)
        assert set(kept) == {"pre"} and kept["pre"].version == 1, daemon.log.lines
        assert kept["pre"].sha256 == wasm_sha256(modules["pre_filter"])

        # the config's pre_filter edited since the start checked its signature: no rollback target, a warning
        kept.clear()
        with open(modules["pre_filter"], "a") as fh:
            fh.write("\n;; edited after signing\n")
        persistence.keep_fallback(hotswap)
        assert not kept
        warning = [f for lvl, msg, f in daemon.log.lines if lvl == "warning" and "rollback target" in msg]
        assert warning and "the file was changed after it was signed" in warning[-1]["error"], daemon.log.lines
    finally:
        host.close()


def test_a_persisted_wat_edited_after_signing_is_refused_with_a_clear_reason(line):
    from sitsd.persist import REJECTED_FILE, STATE_FILE, Persistence

    daemon, _, pre_v2 = line
    before = wasm_sha256(pre_v2)
    with open(pre_v2, "a") as fh:  # a comment: the same wasm, so the persisted (wasm) hash still matches
        fh.write("\n;; edited after signing\n")
    assert wasm_sha256(pre_v2) == before
    persistence = Persistence(daemon)
    assert persistence.restore() is None
    assert persistence.loaded_from == "config"
    (_, kind, text, _, _), = daemon.alerts
    assert kind == "persisted_update" and str(pre_v2) in text, text
    assert "signature check failed" in text and "the file was changed after it was signed" in text, text
    errors = [f for lvl, msg, f in daemon.log.lines if lvl == "error" and msg.startswith("persisted updates not")]
    assert errors and errors[0]["file"] == str(pre_v2), daemon.log.lines
    audit = pre_v2.parents[2] / "audit"
    assert not (audit / STATE_FILE).exists() and (audit / REJECTED_FILE).exists()
