"""The gates of the loop: timestamps, input constraints, and the safety envelope on outputs."""
from .constraints import ConstraintGate
from .safety import SafetyEnvelope
from .timestamp import TimestampGate

__all__ = ["ConstraintGate", "SafetyEnvelope", "TimestampGate"]
