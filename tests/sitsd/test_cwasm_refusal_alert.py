"""A .cwasm cache entry that fails its integrity check is a security event (something wrote into the cache): the
module still loads, recompiled from its source, and says so in a structured attribute (ModuleVersion.cache_refused)
as well as in its `origin` text; the daemon logs a warning and raises a `wasm_cache` alert for a module it loads at
start with such an entry."""
import pytest

from ..conftest import EXAMPLE_CONFIG, REPO

MODULES = REPO / "wasm_modules"


class Log:
    """The daemon's structlog calls, kept: (level, message, fields)."""

    def __init__(self):
        self.lines = []

    def __getattr__(self, level):
        return lambda message, **fields: self.lines.append((level, message, fields))


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)  # wasmtime would deserialize it (field notes): the record's hash must refuse it
    path.write_bytes(bytes(data))


def test_a_tampered_cwasm_entry_is_refused_recompiled_and_says_why(tmp_path):
    from sitsd.wasm import WasmHost

    host = WasmHost(tmp_path / "cache")
    try:
        first = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
        assert first.origin == "compiled" and first.cache_refused is None
        code_path, _ = host.cache.paths(first.sha256)
        corrupt(code_path)
        again = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
        assert again.sha256 == first.sha256 and again.version == first.version  # loaded from source, self-tested
        assert again.cache_refused and str(code_path) in again.cache_refused
        assert "tampered" in again.cache_refused and "recompiled from the module source" in again.cache_refused
        assert again.origin.startswith("compiled (cache entry refused: ")  # the hot swap's reply shows this text
        assert again.describe()["cache_refused"] == again.cache_refused
        third = host.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)  # rewritten: trusted again
        assert third.origin == "cwasm cache" and third.cache_refused is None
    finally:
        host.close()


def test_the_daemon_alerts_when_a_module_it_loads_at_start_had_its_cache_entry_refused(tmp_path, monkeypatch):
    """Daemon._build up to the control loop (stopped there): the config's modules load through the daemon's own
    path from the default cache, one of whose entries was tampered with."""
    from attestation.signers import SoftwareSigner
    from sitsd import daemon as daemon_module
    from sitsd.cli import parse_overrides
    from sitsd.config import load_config
    from sitsd.daemon import Daemon
    from sitsd.notify import Notifier
    from sitsd.wasm import WasmHost, default_cache_dir

    from ..conftest import multicast_group_url

    for var in ("CACHE_DIRECTORY", "STATE_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    seed = WasmHost(default_cache_dir())  # an earlier run's cache entry for the config's pre_filter
    try:
        pre = seed.load("pre_filter", "pre", MODULES / "pre_filter.wat", 6, 6)
        corrupt(seed.cache.paths(pre.sha256)[0])
    finally:
        seed.close()

    class Stop(Exception):
        pass

    def no_loop(**_):
        raise Stop

    monkeypatch.setattr(daemon_module, "ControlLoop", no_loop)  # the step right after the modules load
    cfg = load_config(EXAMPLE_CONFIG, parse_overrides([
        "attestation.mode=software", f"transport.url={multicast_group_url()}", "transport.interface=127.0.0.1",
        f"audit.directory={tmp_path / 'audit'}", f"control.socket={tmp_path / 'c.sock'}"]))
    signer = SoftwareSigner()
    daemon = Daemon(cfg, signer=signer, notifier=Notifier({}))
    daemon.log = Log()
    try:
        with pytest.raises(Stop):
            daemon._build()
        refused = [a for a in daemon.alerts if a[1] == "wasm_cache"]
        assert len(refused) == 1, list(daemon.alerts)
        text = refused[0][2]
        assert text.startswith("module pre_filter (pre, pre_filter.wat): its .cwasm cache entry was refused"), text
        assert "tampered" in text, text
        warnings = [f for lvl, msg, f in daemon.log.lines if msg == "wasm cache entry refused"]
        assert len(warnings) == 1 and warnings[0]["module"] == "pre_filter" and warnings[0]["fix"], daemon.log.lines
    finally:
        for part in (daemon.source, daemon.wasm):
            if part is not None:
                part.close()
        signer.close()
