"""sitsd: the daemon core (config, loop, gates, notify, control socket, CLI)."""
from .config import Config, load_config
from .daemon import Daemon
from .errors import ConfigError, ControlError, SitsError, StartupError

__all__ = ["Config", "load_config", "Daemon", "ConfigError", "ControlError", "SitsError", "StartupError"]
