"""Fault attribution: the FMEA knowledge graph, one event stream, detectors over recent signals, and the
localizer that ranks root causes with evidence (`sitsctl diagnose`, docs/diagnose.md)."""
from .detect import DetectorSettings, detect, model_replay
from .errors import DiagnoseError, FmeaError
from .events import Event, EventStream, SignalRing, SignalWindow, event_from_alert, event_from_plc
from .fmea import Fmea, load_fmea
from .localize import Candidate, Diagnosis, baseline_ranking, localize

__all__ = ["DetectorSettings", "detect", "model_replay", "DiagnoseError", "FmeaError", "Event", "EventStream",
           "SignalRing", "SignalWindow", "event_from_alert", "event_from_plc", "Fmea", "load_fmea", "Candidate",
           "Diagnosis", "baseline_ranking", "localize"]
