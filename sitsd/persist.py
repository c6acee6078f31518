"""Hot swaps that survive a restart: the stage set a hot swap left running, persisted once it passed its
health watch, and loaded again at the next start instead of the model and modules the config names.

Why: without it a crash, a `Restart=on-failure` or a power cut silently brings back the config's (older)
model or module, on a line whose operators last saw the updated one run. The state file
`<audit.directory>/active-stages.json` names the running set (model path + SHA-256, each module's name,
stage, path + wasm SHA-256) and the SHA-256 of the config file (and the `--set` overrides) it was
based on. It is written atomically (temp file, fsync, rename, fsync of the directory) when

- a swapped-in set survives its health watch (hotswap.WATCH_FRAMES frames without an automatic rollback):
  an update that is still being watched is never persisted, so a restart during the watch brings back the
  last good set;
- a rollback (operator or automatic) changes the set;
- the running config is reloaded (SIGHUP, `sitsctl update --config`, `sitsctl deploy`): the persisted set
  is re-based on the new config bytes.

When the set equals what the config names the file is removed: the config alone describes what runs.

At start (`Persistence.restore`, from `Daemon._build`) the config wins whenever it changed since (another
file, edited, `--set` overrides changed): the file is discarded with a log line. The deployment record
wins under verify_on_boot, and the approval under attestation.certify_session: the set is not applied (a
warning says how to make it permanent). Otherwise each
persisted file is checked as an update checks it (hash, attestation.require_signatures, bound proof of a
model, golden vectors of a module) and the whole set is loaded, or none of it: any file missing or not
verifying logs an error and an alert naming the file and the reason, the file is moved aside to
`active-stages.rejected.json` and the config's versions start. Persisted state never stops the daemon
from starting.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .durable import fsync_dir as _fsync_dir
from .durable import replace_durably

STATE_FILE = "active-stages.json"
REJECTED_FILE = "active-stages.rejected.json"
FORMAT = "sits2026-active-stages"
ALERT_KIND = "persisted_update"
PERMANENT_HOWTO = ("to make it permanent, name these files (and their hashes) in the config and deploy it "
                   "(`sitsctl deploy --config FILE`), or restart with the new config")


class PersistedStateError(Exception):
    """A persisted set that cannot be loaded: `path` names the file at fault, `reason` says why."""

    def __init__(self, path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason


# -- the set, as the state file and the comparisons see it -------------------------------------------------
def set_entries(stage_set) -> dict:
    """{model: {path, sha256}, modules: [{name, stage, path, sha256}, ...]} of a hotswap.StageSet."""
    mods = [{"name": m.name, "stage": m.stage, "path": os.path.abspath(m.path), "sha256": m.sha256}
            for m in (stage_set.pre, stage_set.post) if m is not None]
    return {"model": {"path": os.path.abspath(stage_set.model_path), "sha256": stage_set.model_sha256.hex()},
            "modules": mods}


def entries_key(entries: dict | None) -> tuple | None:
    """What makes two sets the same: the bytes that run (model hash, module name/stage/hash), not the paths."""
    if entries is None:
        return None
    return (entries["model"]["sha256"],
            tuple(sorted((m["stage"], m["name"], m["sha256"]) for m in entries["modules"])))


def config_entries(cfg) -> dict:
    """The set the config names, hashed as the loop hashes it. Raises (ep's ModelLoadError, WasmError,
    OSError) when a file does not load; callers treat that as "not the same set"."""
    from .model import model_event
    from .wasm import read_source

    _, model_sha = model_event(cfg)
    path = str(cfg.model.artifact) if cfg.model.artifact is not None else ""
    mods = [{"name": m.name, "stage": m.stage, "path": os.path.abspath(m.path),
             "sha256": hashlib.sha256(read_source(Path(m.path))).hexdigest()}
            for stage in ("pre", "post") for m in cfg.modules if m.stage == stage]
    return {"model": {"path": os.path.abspath(path) if path else "", "sha256": model_sha}, "modules": mods}


def overrides_sha256(overrides: dict | None) -> str:
    """The `--set` overrides change what a config names without changing its bytes: they are part of the base."""
    return hashlib.sha256(json.dumps(overrides or {}, sort_keys=True, default=str).encode()).hexdigest()


def describe_entries(entries: dict) -> str:
    parts = [f"model {Path(entries['model']['path']).name} {entries['model']['sha256'][:12]}"]
    parts += [f"{m['stage']} {m['name']} ({Path(m['path']).name}) {m['sha256'][:12]}" for m in entries["modules"]]
    return ", ".join(parts)


# -- the file -------------------------------------------------------------------------------------------
def write_atomic(path: Path, data: dict) -> bytes:
    """Write temp, fsync, rename over `path`, fsync the directory: after a power cut the file is the old
    one or the new one, never a torn mix. Returns the bytes written."""
    path = Path(path)
    body = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
    replace_durably(path, body, 0o640, tmp=path.with_name(path.name + ".tmp"))
    _fsync_dir(path.parent)
    return body


def remove_durably(path: Path) -> bool:
    """Unlink and fsync the directory (a power cut must not bring the file back). False when absent."""
    path = Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    _fsync_dir(path.parent)
    return True


def read_state(path: Path) -> tuple[dict, bytes]:
    """(state, raw bytes); PersistedStateError when unreadable or not a state file."""
    try:
        raw = Path(path).read_bytes()
        state = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise PersistedStateError(path, f"unreadable ({exc})") from None
    try:
        if state.get("format") != FORMAT:
            raise ValueError(f"format is {state.get('format')!r}, not {FORMAT}")
        for key in ("config_sha256", "overrides_sha256"):
            if not isinstance(state[key], str):
                raise ValueError(f"{key} missing")
        model = state["model"]
        if not (isinstance(model["path"], str) and isinstance(model["sha256"], str)):
            raise ValueError("model needs path and sha256")
        for m in state["modules"]:
            if not all(isinstance(m[k], str) for k in ("name", "stage", "path", "sha256")):
                raise ValueError("each module needs name, stage, path and sha256")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise PersistedStateError(path, f"not a valid {FORMAT} file ({exc})") from None
    return state, raw


def verify_on_boot_governs(cfg) -> bool:
    """True when the staged deployment record decides what may run (as deploy.check_on_boot decides)."""
    if cfg.attestation.verify_on_boot:
        return True
    from .deploy import record_path

    path = record_path(cfg)
    if not path.exists():
        return False
    from attestation.deploy import DeployError, load_record

    try:
        return bool(load_record(path).get("verify_on_boot"))
    except DeployError:
        return True  # check_on_boot refuses such a record anyway; never apply persisted state next to it


@dataclass
class Restored:
    """A verified persisted set, loaded: `model` None means the config's model (same bytes); `modules`
    None means the config's modules, else (host, pre, post)."""

    entries: dict
    raw_sha256: str
    model: object | None
    modules: tuple | None


# -- the daemon's side --------------------------------------------------------------------------------
class Persistence:
    """Owns <audit.directory>/active-stages.json for one daemon. Thread-safe: the hot swap's worker threads
    (settled sets) and the housekeeping task (config reloads) call in; file operations hold one lock."""

    def __init__(self, daemon) -> None:
        self.daemon = daemon
        cfg = daemon.cfg
        self.path = Path(cfg.audit.directory) / STATE_FILE
        self.enabled = bool(getattr(cfg.runtime, "persist_updates", True))
        self.config_sha256: str | None = getattr(daemon, "config_sha256_at_start", None)
        if daemon.config_path is not None and self.config_sha256 is None:
            try:
                self.config_sha256 = hashlib.sha256(Path(daemon.config_path).read_bytes()).hexdigest()
            except OSError:
                self.config_sha256 = None
        self.overrides_sha256 = overrides_sha256(daemon.config_overrides)
        self.loaded_from = "config"  # what the startup set came from: "config" or "persisted"
        self.startup_note = "no persisted updates"
        self.restored: Restored | None = None
        self.config_key: tuple | None = None  # the set the running config names
        self.persisted: dict | None = None  # entries in the state file (None: no file)
        self.last_written_ns: int | None = None
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._warned: set[tuple] = set()
        self._cfg_entries: dict | None = None

    @property
    def log(self):
        return self.daemon.log

    def _alert(self, text: str) -> None:
        self.daemon.alerts.append((time.time_ns(), ALERT_KIND, text, 0, 0))

    def inactive_reason(self) -> str | None:
        """Why nothing is persisted now (None: it is)."""
        if not self.enabled:
            return "runtime.persist_updates is false"
        if self.config_sha256 is None:
            return "the daemon was not started from a readable config file (nothing to base the state on)"
        if verify_on_boot_governs(self.daemon.cfg):
            return "verify_on_boot: the staged deployment record decides what runs at start"
        if self.daemon.cfg.attestation.certify_session:
            return "attestation.certify_session: only the approved model and modules run"
        return None

    # -- at start ---------------------------------------------------------------------------------
    def restore(self) -> Restored | None:
        """The persisted set, verified and loaded, or None (the config's versions start). Never raises for
        anything about the persisted state: it logs (and alerts) and the config wins."""
        if not self.path.exists():
            return None
        cfg = self.daemon.cfg
        if self.config_sha256 is None:
            self.startup_note = "persisted updates ignored: the daemon was not started from a config file"
            self.log.warning("persisted updates ignored", file=str(self.path), reason=self.startup_note)
            return None
        if not self.enabled:
            self._discard("persisted updates discarded: runtime.persist_updates is false")
            return None
        try:
            state, raw = read_state(self.path)
        except PersistedStateError as exc:
            self._reject(exc)
            return None
        entries = {"model": state["model"], "modules": state["modules"]}
        if state["config_sha256"] != self.config_sha256 or state["overrides_sha256"] != self.overrides_sha256:
            what = "config file" if state["config_sha256"] != self.config_sha256 else "--set overrides"
            self._discard(f"persisted updates discarded: the {what} changed since they were persisted "
                          f"(persisted on config sha256 {state['config_sha256'][:16]}…, "
                          f"{state.get('config_path')}; now {self.config_sha256[:16]}…, {self.daemon.config_path}); "
                          f"the config wins (it was: {describe_entries(entries)})")
            return None
        if verify_on_boot_governs(cfg):
            self._discard(f"persisted updates not applied: verify_on_boot is active, so the staged deployment "
                          f"record decides what may run; the config's versions start ({describe_entries(entries)} "
                          f"is not loaded; {PERMANENT_HOWTO})", level="warning")
            return None
        if cfg.attestation.certify_session:
            self._discard(f"persisted updates not applied: attestation.certify_session is on, so the TPM certifies "
                          f"the session key only for the approved model and modules the config names; the config's "
                          f"versions start ({describe_entries(entries)} is not loaded; {PERMANENT_HOWTO})",
                          level="warning")
            return None
        try:
            cfg_entries = config_entries(cfg)
        except Exception:  # the config's own files are checked (and fail) by the normal load path
            cfg_entries = None
        if entries_key(entries) == entries_key(cfg_entries):
            self._discard("persisted updates equal what the config names: state file removed", level="info")
            return None
        try:
            restored = self._load(entries, cfg_entries)
        except PersistedStateError as exc:
            self._reject(exc)
            return None
        except Exception as exc:  # whatever it is, the config's versions start
            self._reject(PersistedStateError(self.path, f"loading the persisted set failed: {exc!r}"))
            return None
        self._cfg_entries = cfg_entries
        restored.raw_sha256 = hashlib.sha256(raw).hexdigest()
        self.restored, self.persisted, self.loaded_from = restored, entries, "persisted"
        self.startup_note = (f"persisted updates loaded from {self.path} (written "
                             f"{state.get('written', '?')}: {state.get('reason', '')})")
        self.log.warning("starting with persisted updates instead of the config's versions", file=str(self.path),
                         stages=describe_entries(entries), persisted_reason=state.get("reason"),
                         config=str(self.daemon.config_path), howto=PERMANENT_HOWTO)
        return restored

    def _discard(self, reason: str, level: str = "warning") -> None:
        self.startup_note = reason
        getattr(self.log, level)("persisted updates", file=str(self.path), action="discarded", reason=reason)
        try:
            remove_durably(self.path)
        except OSError as exc:
            self.log.error("could not remove the persisted state file", file=str(self.path), error=str(exc))

    def _reject(self, exc: PersistedStateError) -> None:
        rejected = self.path.with_name(REJECTED_FILE)
        text = (f"persisted updates not loaded, the config's versions start instead: {exc.path}: {exc.reason} "
                f"(state file moved to {rejected})")
        self.startup_note = text
        self.log.error("persisted updates not loaded; starting with the config's model and modules",
                       file=exc.path, reason=exc.reason, state_file=str(self.path), moved_to=str(rejected),
                       fix="restore the file named, or `sitsctl update` the running daemon again")
        self._alert(text)
        try:
            os.replace(self.path, rejected)
            _fsync_dir(self.path.parent)
        except OSError as err:
            self.log.error("could not move the persisted state file aside", file=str(self.path), error=str(err))

    def _load(self, entries: dict, cfg_entries: dict | None) -> Restored:
        """Verify and load each persisted file the way an update does; PersistedStateError at the first
        that fails (what was loaded is released: all of the set or none of it)."""
        from ep.errors import ModelLoadError
        from ep.session import ModelRunner

        cfg = self.daemon.cfg
        cfg_model_sha = cfg_entries["model"]["sha256"] if cfg_entries else None
        want = entries["model"]
        runner = None
        if want["sha256"] != cfg_model_sha:
            if cfg.model.kind != "mlp":
                raise PersistedStateError(want["path"], f"model.kind {cfg.model.kind} does not hot swap its model")
            path = self._existing(want["path"], "model")
            if cfg.model.sha256 and cfg.model.sha256 != want["sha256"]:
                raise PersistedStateError(path, f"the config pins model.sha256 {cfg.model.sha256}, the persisted "
                                          f"model is {want['sha256']}")
            from .signatures import model_sha256 as file_model_sha256

            self._hash_matches(path, want["sha256"], lambda: file_model_sha256(path))
            self._signature(path, "model", want["sha256"])
            try:
                runner = ModelRunner(path, len(cfg.model.inputs), len(cfg.model.outputs),
                                     expected_sha256=want["sha256"], policy=cfg.model.provider)
            except ModelLoadError as exc:
                raise PersistedStateError(path, f"does not load: {exc}") from None
            from .check import swap_bounds_check

            try:
                proven, report = swap_bounds_check(cfg, path)
            except Exception as exc:
                raise PersistedStateError(path, f"bound proof failed: {exc!r}") from None
            if not proven:
                raise PersistedStateError(path, f"output bounds not proven inside the actuator limits of this "
                                          f"config: {report.splitlines()[0] if report else 'no report'}")
        specs = {(m.stage, m.name): m for m in cfg.modules}
        have = {(m["stage"], m["name"]): m for m in entries["modules"]}
        if set(have) != set(specs):
            raise PersistedStateError(self.path, f"modules {sorted(have)} persisted, the config names "
                                      f"{sorted(specs)}")
        cfg_mod_sha = {(m["stage"], m["name"]): m["sha256"] for m in (cfg_entries or {"modules": []})["modules"]}
        modules = None
        if any(have[k]["sha256"] != cfg_mod_sha.get(k) for k in have):
            modules = self._load_modules(cfg, specs, have)
        return Restored(entries, "", runner, modules)

    def _load_modules(self, cfg, specs: dict, have: dict) -> tuple:
        import hashlib as _h

        from .hotswap import module_limits
        from .wasm import WasmError, WasmHost, source_wasm

        host = WasmHost()
        loaded = {}
        try:
            for stage in ("pre", "post"):
                for (st, name), m in have.items():
                    if st != stage:
                        continue
                    spec = specs[(st, name)]
                    path = self._existing(m["path"], f"module {name}")
                    if spec.sha256 and spec.sha256 != m["sha256"]:
                        raise PersistedStateError(path, f"the config pins module {name} to sha256 {spec.sha256}, "
                                                  f"the persisted one is {m['sha256']}")
                    # the file read once: the persisted hash is the wasm's (of a .wat: after converting it), a
                    # signature covers the file's own bytes (as at startup and in a hot swap), and the host loads
                    # only bytes with that file hash, so what runs is what both checks saw
                    data = self._read(path)
                    file_sha = _h.sha256(data).hexdigest()
                    self._hash_matches(path, m["sha256"],
                                       lambda p=path, d=data: _h.sha256(source_wasm(p, d)).hexdigest())
                    self._signature(path, "module", file_sha)
                    n = len(cfg.model.inputs) if stage == "pre" else len(cfg.model.outputs)
                    try:
                        loaded[stage] = host.load(name, stage, path, n, n, expected_sha256=m["sha256"],
                                                  limits=module_limits(spec), expected_file_sha256=file_sha)
                    except WasmError as exc:  # ABI, width, selftest, golden vectors
                        raise PersistedStateError(path, f"does not load: {exc}") from None
        except BaseException:
            host.close()
            raise
        return host, loaded.get("pre"), loaded.get("post")

    @staticmethod
    def _existing(path: str, what: str) -> Path:
        p = Path(path)
        if not p.exists():
            raise PersistedStateError(p, f"{what} file missing")
        return p

    @staticmethod
    def _read(path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise PersistedStateError(path, f"cannot be read: {exc.strerror}") from None

    @staticmethod
    def _hash_matches(path: Path, want: str, compute) -> None:
        try:
            have = compute()
        except Exception as exc:  # unreadable, a .wat that no longer parses, an artifact that does not verify
            raise PersistedStateError(path, f"cannot be hashed: {exc}") from None
        if have != want:
            raise PersistedStateError(path, f"SHA-256 is now {have}, the persisted update was {want}: the file "
                                      "changed after the update was persisted")

    def _signature(self, path: Path, kind: str, sha256: str) -> None:
        """attestation.require_signatures for a persisted file. `sha256` is the digest its signature covers: a
        model's as ep names it, a module's *file* bytes (a .wat's text, not the wasm the state file records)."""
        from attestation.signatures import SignatureError

        from .signatures import SignaturePolicy

        try:
            SignaturePolicy.from_config(self.daemon.cfg).check(kind, path, sha256)
        except SignatureError as exc:
            raise PersistedStateError(path, f"signature check failed: {exc}") from None

    def keep_fallback(self, hotswap) -> None:
        """After a start on persisted updates: load the config's versions of what they replaced (not run), so
        `sitsctl rollback` (and an automatic rollback in the watch of the restored set) returns to them.
        Best effort: when they do not load, the persisted set runs without a rollback target. A module needs its
        signature (attestation.require_signatures) as at startup: over its file bytes, which the host then loads."""
        from .hotswap import module_limits
        from .wasm import source_wasm

        if self.restored is None:
            return
        cfg, r = self.daemon.cfg, self.restored
        changes = {}
        try:
            if r.model is not None:
                from ep.session import ModelRunner

                runner = ModelRunner(cfg.model.artifact, len(cfg.model.inputs), len(cfg.model.outputs),
                                     expected_sha256=cfg.model.sha256, policy=cfg.model.provider)
                changes.update(model=runner, model_sha256=runner.sha256, model_path=str(runner.path))
            if r.modules is not None:
                host, pre, post = r.modules
                for spec in cfg.modules:
                    running = pre if spec.stage == "pre" else post
                    path = Path(spec.path)
                    data = self._read(path)
                    if running.sha256 == hashlib.sha256(source_wasm(path, data)).hexdigest():
                        continue
                    file_sha = hashlib.sha256(data).hexdigest()
                    self._signature(path, "module", file_sha)  # checked at startup, but the file may differ now
                    n = len(cfg.model.inputs) if spec.stage == "pre" else len(cfg.model.outputs)
                    changes[spec.stage] = host.load(spec.name, spec.stage, path, n, n, expected_sha256=spec.sha256,
                                                    limits=module_limits(spec), expected_file_sha256=file_sha)
        except Exception as exc:  # ModelLoadError, WasmError, PersistedStateError: the persisted set runs regardless
            self.log.warning("the config's versions did not load as the rollback target of the persisted updates; "
                             "`sitsctl rollback` has nothing to return to until the next update",
                             error=str(exc).splitlines()[0])
            return
        report = getattr(self.daemon, "report_cache_refused", None)
        if report is not None:  # a refused .cwasm entry of a rollback target: the same security event
            report(changes.get("pre"), changes.get("post"))
        if changes:
            hotswap.keep_fallback("config's versions (before the persisted updates)", **changes)

    def started(self, stage_set) -> None:
        """After the loop is built: what the config names, for the "equals the config" decisions."""
        if self.restored is None:
            self.config_key = entries_key(set_entries(stage_set))
            return
        self.config_key = entries_key(self._cfg_entries)  # computed by restore (None: did not load)

    # -- while running ------------------------------------------------------------------------------
    def settled(self, stage_set, reason: str) -> None:
        """A set that passed its health watch, or that a rollback made current: persist it (or remove the
        file when it is the config's). Never raises: a failure is logged and alerted, the set keeps running."""
        entries = set_entries(stage_set)
        key = entries_key(entries)
        inactive = self.inactive_reason()
        with self._lock:
            if inactive is not None:
                if key != self.config_key and (key, inactive) not in self._warned:
                    self._warned.add((key, inactive))
                    self.log.warning("hot swap not persisted: a restart brings back the config's versions",
                                     reason=inactive, stages=describe_entries(entries), howto=PERMANENT_HOWTO)
                return
            self._store(entries, key, reason)

    def config_reloaded(self) -> None:
        """The running config was reloaded: re-base the persisted set on the new config bytes (the updates
        keep running on top of it), or remove the file when the set is now the config's."""
        daemon = self.daemon
        with self._lock:
            try:
                self.config_sha256 = (hashlib.sha256(Path(daemon.config_path).read_bytes()).hexdigest()
                                      if daemon.config_path is not None else None)
            except OSError:
                self.config_sha256 = None
            try:
                self.config_key = entries_key(config_entries(daemon.cfg))
            except Exception:
                self.config_key = None
            if self.persisted is None or self.inactive_reason() is not None:
                return
            self._store(self.persisted, entries_key(self.persisted), "config reloaded: persisted set re-based",
                        rebase=True)

    def _store(self, entries: dict, key: tuple, reason: str, rebase: bool = False) -> None:
        if (not rebase and self.persisted is not None and key == entries_key(self.persisted) and key != self.config_key
                and self.path.exists()):
            return  # already what the file says (the restored set passing its watch, a rollback to it)
        try:
            if key == self.config_key:
                if remove_durably(self.path):
                    self.log.info("persisted updates removed: the running set is what the config names",
                                  file=str(self.path), reason=reason)
                self.persisted = None
                return
            state = {"format": FORMAT, "version": 1, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "written_ns": time.time_ns(), "reason": reason, "config_path": str(self.daemon.config_path),
                     "config_sha256": self.config_sha256, "overrides_sha256": self.overrides_sha256,
                     "model": entries["model"], "modules": entries["modules"]}
            Path(self.path.parent).mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, state)
        except OSError as exc:
            self.last_error = f"{self.path}: {exc}"
            self.log.error("could not persist the running stage set; a restart brings back the previous one",
                           file=str(self.path), error=str(exc), fix="check that audit.directory is writable "
                           "and not full")
            self._alert(f"could not persist the running stage set to {self.path}: {exc}")
            return
        self.persisted, self.last_written_ns, self.last_error = entries, time.time_ns(), None
        self.log.info("stage set persisted: a restart loads it instead of the config's versions",
                      file=str(self.path), stages=describe_entries(entries), reason=reason)

    # -- reporting ---------------------------------------------------------------------------------
    def describe(self, stage_set) -> dict:
        """For `status` and `versions`: where the running set came from and what a restart would load."""
        key = entries_key(set_entries(stage_set)) if stage_set is not None else None
        if key is None:
            source = self.loaded_from
        elif key == self.config_key:
            source = "config"
        elif self.persisted is not None and key == entries_key(self.persisted):
            source = "persisted"
        else:
            source = "hot swap (not persisted)"
        inactive = self.inactive_reason()
        restart = "persisted" if self.persisted is not None and inactive is None and self.path.exists() else "config"
        return {"stages_source": source,
                "persistence": {"enabled": self.enabled, "inactive_reason": inactive,
                                "state_file": str(self.path), "loaded_at_start": self.loaded_from,
                                "startup_note": self.startup_note, "restart_loads": restart,
                                "persisted": self.persisted, "last_written_ns": self.last_written_ns,
                                "last_error": self.last_error}}
