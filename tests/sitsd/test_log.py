import io
import json

from sitsd.log import configure, get_logger


def test_json_lines_with_journald_priority_prefix():
    out = io.StringIO()
    configure("info", out, syslog_prefix=True)
    log = get_logger("test")
    log.warning("alert", kind="stale", count=3)
    log.debug("hidden")
    (line,) = out.getvalue().splitlines()
    assert line.startswith("<4>{")
    event = json.loads(line[3:])
    assert event["event"] == "alert" and event["kind"] == "stale" and event["level"] == "warning"
    assert event["timestamp"].endswith("Z")


def test_plain_json_lines():
    out = io.StringIO()
    configure("debug", out)
    get_logger().info("ready", line="stand-3")
    assert json.loads(out.getvalue())["line"] == "stand-3"
