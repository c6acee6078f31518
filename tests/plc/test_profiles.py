"""Vendor profiles: address round trips, exact parse errors, status words and diagnostic texts -> events."""
import dataclasses
import json
import re
import subprocess
import sys
from importlib import resources
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plc.errors import PlcError
from plc.profiles import (ADDRESS_KINDS, PROFILE_NAMES, SEVERITIES, Address, LogixProfile, MelsecProfile, PlcEvent,
                          PlcProfile, ProfileError, S7Profile, SimulatorProfile, get_profile, load_data)

DATA_FILES = ("s7_1500.json", "controllogix.json", "melsec_iq_r.json")
ENTRY_KEYS = {"code", "severity", "component", "text", "source"}

S7 = S7Profile()
LOGIX = LogixProfile()
MELSEC = MelsecProfile()
SIM = SimulatorProfile()


def _error(profile, text):
    with pytest.raises(ProfileError) as info:
        profile.parse(text)
    return info.value


# -- data files --------------------------------------------------------------------------------

def _entries(data):
    """Every event-producing table entry of a data file, with a label for failure messages."""
    for i, rule in enumerate(data.get("diagnostic_rules", ())):
        if "lookup" not in rule:
            yield f"diagnostic_rules[{i}]", rule
    for table in ("major_faults", "minor_faults", "sd0_codes"):
        for key, entry in data.get(table, {}).items():
            yield f"{table}[{key}]", entry
    status = data.get("status_word", {})
    for field in status.get("fields", ()):
        for key, entry in field["values"].items():
            yield f"{field['name']}[{key}]", entry
    for flag in status.get("flags", ()):
        for state in ("set", "clear"):
            if flag.get(state):
                yield f"flag {flag['mask']}.{state}", flag[state]


@pytest.mark.parametrize("filename", DATA_FILES)
def test_data_file_loads_with_sources_and_complete_entries(filename):
    data = load_data(filename)
    sources = data["sources"]
    assert sources and all(re.match(r"https?://\S+$", s) for s in sources)
    entries = list(_entries(data))
    assert entries, f"{filename} has no event entries"
    for label, entry in entries:
        assert ENTRY_KEYS <= entry.keys(), (label, ENTRY_KEYS - entry.keys())
        assert entry["severity"] in SEVERITIES, label
        assert entry["source"] in sources, f"{label}: source {entry['source']} not listed in 'sources'"
        assert entry["code"].startswith(("S7.", "LOGIX.", "MELSEC.")), label
    for rule in data["diagnostic_rules"]:
        re.compile(rule["pattern"])
    assert data["diagnostic_examples"] and data["status_examples"]


def test_data_files_are_package_resources_and_fresh_copies():
    files = {p.name for p in resources.files("plc.profiles").iterdir()}
    assert set(DATA_FILES) <= files
    first = load_data("s7_1500.json")
    first["sources"].clear()
    assert load_data("s7_1500.json")["sources"], "load_data must not hand out a shared mutable dict"


def test_every_device_and_mode_entry_is_sourced():
    melsec = load_data("melsec_iq_r.json")
    for sym, dev in melsec["devices"].items():
        assert {"name", "type", "radix", "source"} <= dev.keys(), sym
        assert dev["type"] in ("bit", "word", "double_word") and dev["radix"] in (10, 16), sym
        assert dev["source"] in melsec["sources"], sym
    s7 = load_data("s7_1500.json")
    for key, mode in s7["operating_modes"].items():
        if not key.startswith("_"):
            assert {"key", "name", "severity", "source"} <= mode.keys() and mode["source"] in s7["sources"], key


def test_load_data_rejects_a_file_without_sources(monkeypatch):
    from plc.profiles import base
    monkeypatch.setattr(base, "_read", lambda name: json.dumps({"sources": []}))
    with pytest.raises(ValueError, match="sources"):
        base.load_data("whatever.json")


# -- registry and interface --------------------------------------------------------------------

def test_registry_names_match_the_daemon_config():
    from sitsd.config import PlcSection
    assert set(PROFILE_NAMES) == set(get_args(PlcSection.model_fields["profile"].annotation))
    for name in PROFILE_NAMES:
        profile = get_profile(name)
        assert profile.name == name and isinstance(profile, PlcProfile)


def test_unknown_profile_lists_the_known_names():
    with pytest.raises(ProfileError) as info:
        get_profile("s5")
    assert str(info.value) == ("unknown PLC profile 's5'; known profiles: controllogix, melsec-iq-r, s7-1500, "
                               "simulator; example of a valid one: s7-1500")
    assert isinstance(info.value, PlcError)


def test_registry_passes_options_and_rejects_bad_ones():
    assert get_profile("s7-1500", namespace_index=4).parse("DB1.x").node_id == 'ns=4;s="DB1"."x"'
    with pytest.raises(ProfileError, match="bad options"):
        get_profile("simulator", namespace_index=4)


def test_profile_error_carries_its_parts():
    err = _error(MELSEC, "D1F")
    assert (err.profile, err.address, err.offset) == ("melsec-iq-r", "D1F", 2)
    assert err.example and err.reason.startswith("D (Data register)")
    assert isinstance(err, PlcError)


def test_plc_packages_import_no_daemon_code():
    code = ("import sys, plc.profiles; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sitsd', 'ep', 'attestation')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plc_event_is_frozen_and_checks_severity():
    ev = PlcEvent("S7.X", "info", "cpu", "t", 1, "Siemens", "t")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.code = "other"
    with pytest.raises(ValueError, match="severity"):
        PlcEvent("S7.X", "fatal", "cpu", "t", 1, "Siemens", "t")


# -- Siemens S7-1500 ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,normal,node_id", [
    ("DB_Line.Thickness", "DB_Line.Thickness", 'ns=3;s="DB_Line"."Thickness"'),
    ("DB_Line.Values[3]", "DB_Line.Values[3]", 'ns=3;s="DB_Line"."Values"[3]'),
    ('"DB Line"."Stand 3".Gap', '"DB Line"."Stand 3".Gap', 'ns=3;s="DB Line"."Stand 3"."Gap"'),
    ('"DB_Line"."Thickness"', "DB_Line.Thickness", 'ns=3;s="DB_Line"."Thickness"'),
    ('"Line.A".Gap', '"Line.A".Gap', 'ns=3;s="Line.A"."Gap"'),
    ("Grid[1, -2].v", "Grid[1,-2].v", 'ns=3;s="Grid"[1,-2]."v"'),
    ("M_marcha", "M_marcha", 'ns=3;s="M_marcha"'),
])
def test_s7_addresses_and_quoting(text, normal, node_id):
    address = S7.parse(text)
    assert address == Address("s7-1500", "tag", normal, node_id)
    assert S7.parse_node_id(node_id) == address
    assert S7.format(address) == normal and S7.format(text) == normal


def test_s7_namespace_is_configurable_and_uri_form_is_accepted():
    uri = "http://www.siemens.com/simatic-s7-opcua"
    assert S7Profile(namespace_index=5).node_id_for("DB1.x") == 'ns=5;s="DB1"."x"'
    by_uri = S7Profile(use_namespace_uri=True).parse("DB1.x")
    assert by_uri.node_id == f'nsu={uri};s="DB1"."x"'
    assert S7.parse_node_id(by_uri.node_id).text == "DB1.x"


@pytest.mark.parametrize("text,offset,reason", [
    ("", 0, "empty address"),
    ("DB_Line.", 8, "a name must follow '.'"),
    ('"DB Line.Gap', 0, "unterminated quoted name (missing closing '\"')"),
    ('"".Gap', 0, "empty quoted name"),
    ("DB..Gap", 3, "a name starts with a letter or '_', or is written in double quotes"),
    ("3DB.Gap", 0, "a name starts with a letter or '_', or is written in double quotes"),
    ("DB Line.Gap", 2, "expected '.' between names or the end of the address, found ' '"),
    ("DB.Values[x]", 10, "an array index is an integer, e.g. [3] or [1,2]"),
    ("DB.Values[3", 11, "expected ',' or ']' in an array index, found end of text"),
    ('DB."a"b', 6, "expected '.' between names or the end of the address, found 'b'"),
])
def test_s7_invalid_addresses(text, offset, reason):
    err = _error(S7, text)
    assert (err.offset, err.reason) == (offset, reason)
    example = '"DB Line"."Stand 3".Gap'
    assert str(err) == f"s7-1500: {reason} at offset {offset} in {text!r}; example of a valid one: {example}"


@pytest.mark.parametrize("node_id,offset,reason", [
    ('ns=4;s="DB"."x"', 3, "namespace index 4 is not the S7 namespace index 3"),
    ('nsu=urn:other;s="DB"."x"', 4,
     "namespace 'urn:other' is not the S7 namespace 'http://www.siemens.com/simatic-s7-opcua'"),
    ('ns=3;i=5', 5, "only string identifiers ('s=') are used by this profile"),
    ('"DB"."x"', 0, "a NodeId starts with 'ns=<index>;' or 'nsu=<namespace uri>;'"),
    ('ns=3;s="DB".', 12, "a name must follow '.'"),
])
def test_s7_invalid_node_ids(node_id, offset, reason):
    with pytest.raises(ProfileError) as info:
        S7.parse_node_id(node_id)
    assert (info.value.offset, info.value.reason) == (offset, reason)


_s7_ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True)
_s7_free = st.text(st.characters(blacklist_characters='"', blacklist_categories=("Cs", "Cc")), min_size=1, max_size=10)
_s7_part = st.tuples(st.one_of(_s7_ident, _s7_free), st.lists(st.integers(-999, 999), max_size=3), st.booleans())


@settings(max_examples=300)
@given(st.lists(_s7_part, min_size=1, max_size=4))
def test_s7_round_trip_generated(parts):
    def shown(name, quote):
        return f'"{name}"' if quote or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else name
    text = ".".join(shown(n, q) + (f"[{', '.join(map(str, i))}]" if i else "") for n, i, q in parts)
    address = S7.parse(text)
    expected_id = ".".join(f'"{n}"' + (f"[{','.join(map(str, i))}]" if i else "") for n, i, _ in parts)
    assert address.node_id == f"ns=3;s={expected_id}"
    assert S7.parse(S7.format(address)) == address
    assert S7.parse_node_id(address.node_id) == address


# -- Rockwell ControlLogix ---------------------------------------------------------------------

@pytest.mark.parametrize("text,kind,normal", [
    ("Program:MainProgram.Thickness", "tag", "Program:MainProgram.Thickness"),
    ("PROGRAM:MainProgram.Thickness", "tag", "Program:MainProgram.Thickness"),
    ("Line1_Gap[2].Value", "tag", "Line1_Gap[2].Value"),
    ("Tag.5", "bit", "Tag.5"),
    ("Arr[1,2]", "tag", "Arr[1,2]"),
    ("Arr[ 1, 2 ,3 ]", "tag", "Arr[1,2,3]"),
    ("Program:Mill.Stands[3].Status.31", "bit", "Program:Mill.Stands[3].Status.31"),
    ("_Hidden.x0", "tag", "_Hidden.x0"),
])
def test_logix_tag_paths(text, kind, normal):
    address = LOGIX.parse(text)
    assert address == Address("controllogix", kind, normal, f"ns=2;s=[PLC]{normal}")
    assert LOGIX.parse_node_id(address.node_id) == address


def test_logix_shortcut_and_prefix_are_configurable():
    assert LogixProfile(shortcut="Mill").node_id_for("Tag.5") == "ns=2;s=[Mill]Tag.5"
    kep = LogixProfile(namespace_index=2, prefix="Channel1.Device1.")
    address = kep.parse("Program:MainProgram.Thickness")
    assert address.node_id == "ns=2;s=Channel1.Device1.Program:MainProgram.Thickness"
    assert kep.parse_node_id(address.node_id) == address


@pytest.mark.parametrize("text,offset,reason", [
    ("", 0, "empty tag path"),
    ("Tag__Gap", 4, "a tag or member name has no consecutive underscores"),
    ("Gap_", 3, "a tag or member name does not end with an underscore"),
    ("A" * 41, 40, "a tag or member name has at most 40 characters"),
    ("Tag.32", 4, "a bit number is 0..31"),
    ("Tag.5.Value", 5, "a bit number can only end the tag path"),
    ("5", 0, "a tag or member name starts with a letter or '_', found '5'"),
    ("Arr[1,2,3,4]", 3, "Logix arrays have at most 3 dimensions"),
    ("Arr[-1]", 4, "an array subscript is a non-negative integer, e.g. [2] or [1,2]"),
    ("Arr[1;2]", 5, "expected ',' or ']' in an array subscript, found ';'"),
    ("Program:MainProgram", 19, "expected '.' after the program name, found end of text"),
    ("Local:1:I.Data", 5, "':' only appears in the 'Program:<name>.' prefix"),
    ("Tag..x", 4, "a tag or member name starts with a letter or '_', found '.'"),
])
def test_logix_invalid_tag_paths(text, offset, reason):
    err = _error(LOGIX, text)
    assert (err.offset, err.reason) == (offset, reason)
    assert str(err).endswith("example of a valid one: Program:MainProgram.Line1_Gap[2].Value")


def test_logix_node_id_errors():
    with pytest.raises(ProfileError) as info:
        LOGIX.parse_node_id("ns=2;s=[Other]Tag")
    assert (info.value.offset, info.value.reason) == (7, "expected the gateway prefix '[PLC]'")
    with pytest.raises(ProfileError) as info:
        LOGIX.parse_node_id("ns=2;s=[PLC]Tag__x")
    assert info.value.offset == 16  # the second underscore, as for "Tag__x" at offset 4


_logix_name = st.from_regex(r"(?:[A-Za-z]|_[A-Za-z0-9])(?:_?[A-Za-z0-9]){0,10}", fullmatch=True)
_logix_member = st.tuples(_logix_name, st.lists(st.integers(0, 9999), max_size=3))


@settings(max_examples=300)
@given(st.one_of(st.none(), _logix_name), st.lists(_logix_member, min_size=1, max_size=4),
       st.one_of(st.none(), st.integers(0, 31)), st.sampled_from(["", " "]))
def test_logix_round_trip_generated(program, members, bit, space):
    path = ".".join(n + (f"[{(',' + space).join(map(str, s))}]" if s else "") for n, s in members)
    text = (f"Program:{program}." if program else "") + path + (f".{bit}" if bit is not None else "")
    address = LOGIX.parse(text)
    assert address.text == text.replace(" ", "")
    assert address.kind == ("bit" if bit is not None else "tag")
    assert LOGIX.parse(LOGIX.format(address)) == address
    assert LOGIX.parse_node_id(address.node_id) == address


# -- Mitsubishi MELSEC iQ-R --------------------------------------------------------------------

@pytest.mark.parametrize("text,kind,normal", [
    ("D100", "word", "D100"), ("M20", "bit", "M20"), ("X1F", "bit", "X1F"), ("Y2A", "bit", "Y2A"),
    ("B1F", "bit", "B1F"), ("W1A", "word", "W1A"), ("ZR1000", "word", "ZR1000"), ("SM0", "bit", "SM0"),
    ("SD0", "word", "SD0"), ("D100.F", "bit", "D100.F"), ("d0100.a", "bit", "D100.A"), ("x001f", "bit", "X1F"),
    ("LTN5", "word", "LTN5"), ("DX10", "bit", "DX10"), ("SW1FF", "word", "SW1FF"), ("W1A.0", "bit", "W1A.0"),
])
def test_melsec_devices(text, kind, normal):
    address = MELSEC.parse(text)
    assert address == Address("melsec-iq-r", kind, normal, f"ns=2;s={normal}")
    assert MELSEC.parse_node_id(address.node_id) == address


def test_melsec_hex_and_decimal_numbering_differ():
    # X10 is the 17th input (hexadecimal), D10 the 11th data register (decimal): both normalize as written,
    # but only hexadecimal devices accept A-F and leading zeros never change the number.
    assert MELSEC.parse("X010").text == "X10" and MELSEC.parse("D010").text == "D10"
    assert MELSEC.parse("XA").text == "XA"
    err = _error(MELSEC, "DA")
    assert (err.offset, err.reason) == (1, "D (Data register) needs a decimal device number")
    for sym, dev in load_data("melsec_iq_r.json")["devices"].items():
        kind = "bit" if dev["type"] == "bit" else "word"
        assert MELSEC.parse(f"{sym}1").kind == kind, sym
        if dev["radix"] == 16:
            assert MELSEC.parse(f"{sym}1F").text == f"{sym}1F", sym
        else:
            assert _error(MELSEC, f"{sym}1F").offset == len(sym) + 1, sym


@pytest.mark.parametrize("text,offset,reason", [
    ("", 0, "empty device address"),
    ("D1F", 2, "D (Data register) is numbered in decimal; 'F' is not a decimal digit"),
    ("X1G", 2, "X (Input) is numbered in hexadecimal; 'G' is not a hexadecimal digit"),
    ("M", 1, "M (Internal relay) needs a decimal device number"),
    ("M20.1", 3, "M (Internal relay) is a bit device; '.<bit>' applies to word devices only"),
    ("LTN5.1", 4, "LTN (Long timer current value) is a double word device; '.<bit>' applies to word devices only"),
    ("D100.10", 5, "the bit of a word device is one hexadecimal digit 0-F"),
    ("D100.", 5, "the bit of a word device is one hexadecimal digit 0-F"),
    ("100", 0, "a device address starts with a device symbol such as D, M, X or ZR"),
    ("D99999999999", 1, "device number exceeds 4294967295"),
])
def test_melsec_invalid_devices(text, offset, reason):
    err = _error(MELSEC, text)
    assert (err.offset, err.reason) == (offset, reason)


def test_melsec_unknown_device_lists_the_known_ones():
    err = _error(MELSEC, "Q5")
    assert err.offset == 0 and err.reason.startswith("unknown device 'Q'; MELSEC iQ-R devices: B, CC, CN")
    assert "ZR" in err.reason


def test_melsec_prefix_and_node_id_errors():
    profile = MelsecProfile(namespace_index=4, prefix="RCPU.")
    address = profile.parse("D100.F")
    assert address.node_id == "ns=4;s=RCPU.D100.F" and profile.parse_node_id(address.node_id) == address
    with pytest.raises(ProfileError) as info:
        profile.parse_node_id("ns=4;s=RCPU.D1F")
    assert info.value.offset == 14


_melsec_devices = sorted(load_data("melsec_iq_r.json")["devices"].items())


@settings(max_examples=400)
@given(st.sampled_from(_melsec_devices), st.integers(0, 10**7), st.integers(0, 3), st.booleans(),
       st.one_of(st.none(), st.integers(0, 15)))
def test_melsec_round_trip_generated(device, number, zeros, lower, bit):
    sym, dev = device
    digits = format(number, "X") if dev["radix"] == 16 else str(number)
    if dev["type"] != "word":
        bit = None
    text = sym + "0" * zeros + digits + (f".{bit:X}" if bit is not None else "")
    address = MELSEC.parse(text.lower() if lower else text)
    assert address.text == sym + digits + (f".{bit:X}" if bit is not None else "")
    assert address.kind in ADDRESS_KINDS
    assert MELSEC.parse(MELSEC.format(address)) == address
    assert MELSEC.parse_node_id(address.node_id) == address


# -- status words ------------------------------------------------------------------------------

def _codes(events):
    return [(e.code, e.severity) for e in events]


def test_s7_mode_byte():
    (run,) = S7.decode_status(0x58, timestamp_ns=123)
    assert run == PlcEvent("S7.MODE.RUN", "info", "cpu", "Mode transition from Startup (complete restart) to RUN",
                           123, "Siemens", 0x58)
    assert _codes(S7.decode_status(0x84)) == [("S7.MODE.STOP_INTERNAL", "warning")]
    assert S7.decode_status(0x84)[0].text == "Mode transition from RUN to STOP (internal)"
    assert _codes(S7.decode_status(0x8A)) == [("S7.MODE.HOLD", "warning")]
    assert _codes(S7.decode_status(0x4D)) == [("S7.MODE.DEFECT", "critical")]
    assert _codes(S7.decode_status(0x86)) == [("S7.UNKNOWN", "warning")]  # mode ID 6 is not in the SZL table
    assert _codes(S7.decode_status(0x1FF)) == [("S7.UNKNOWN", "warning")]
    assert S7.decode_status("RUN")[0].raw == "RUN"


def test_logix_cip_status_word():
    assert _codes(LOGIX.decode_status(0x0065)) == [("LOGIX.STATUS.IO_RUN", "info")]
    assert _codes(LOGIX.decode_status(0x0455)) == [("LOGIX.STATUS.MAJOR_FAULT", "critical"),
                                                   ("LOGIX.STATUS.MAJOR_RECOVERABLE_FAULT", "critical")]
    assert _codes(LOGIX.decode_status(0x0B20)) == [("LOGIX.STATUS.IO_CONNECTION_FAULTED", "warning"),
                                                   ("LOGIX.STATUS.MINOR_RECOVERABLE_FAULT", "warning"),
                                                   ("LOGIX.STATUS.MINOR_UNRECOVERABLE_FAULT", "error"),
                                                   ("LOGIX.STATUS.MAJOR_UNRECOVERABLE_FAULT", "critical")]
    assert _codes(LOGIX.decode_status(0x0085)) == [("LOGIX.UNKNOWN", "warning")]  # extended status 8 is unlisted
    assert _codes(LOGIX.decode_status(0x10000)) == [("LOGIX.UNKNOWN", "warning")]
    assert all(e.raw == 0x0455 and e.vendor == "Rockwell Automation" for e in LOGIX.decode_status(0x0455))


def test_melsec_sm0_sm1_word():
    assert _codes(MELSEC.decode_status(0)) == [("MELSEC.SM0.OFF", "info")]
    assert _codes(MELSEC.decode_status(0x0001)) == [("MELSEC.SM0.ON", "warning")]
    assert _codes(MELSEC.decode_status(0x0003)) == [("MELSEC.SM0.ON", "warning"), ("MELSEC.SM1.ON", "error")]
    assert _codes(MELSEC.decode_status(-1)) == [("MELSEC.UNKNOWN", "warning")]
    assert _codes(MELSEC.decode_status(True)) == [("MELSEC.UNKNOWN", "warning")]


@pytest.mark.parametrize("name", ["s7-1500", "controllogix", "melsec-iq-r"])
def test_example_inputs_decode_to_known_events(name):
    profile = get_profile(name)
    assert profile.example_status() and profile.example_diagnostics()
    for word in profile.example_status():
        events = profile.decode_status(word, timestamp_ns=7)
        assert events and all(not e.code.endswith(".UNKNOWN") and e.timestamp_ns == 7 for e in events), hex(word)
    for text in profile.example_diagnostics():
        event = profile.parse_diagnostic(text, timestamp_ns=9)
        assert not event.code.endswith(".UNKNOWN") and event.raw == text and event.timestamp_ns == 9, text


# -- diagnostic texts --------------------------------------------------------------------------

@pytest.mark.parametrize("text,code,severity,component", [
    ("Mode transition from RUN to STOP", "S7.MODE.STOP", "warning", "cpu"),
    ("Mode transition from STOP to STARTUP", "S7.MODE.STARTUP", "info", "cpu"),
    ("Mode transition from STARTUP to RUN", "S7.MODE.RUN", "info", "cpu"),
    ("Error in user program", "S7.PROG.ERROR", "error", "user_program"),
    ("Area length error when reading", "S7.PROG.AREA_LENGTH_READ", "error", "user_program"),
    ("Area length error when writing", "S7.PROG.AREA_LENGTH_WRITE", "error", "user_program"),
    ("Area error when reading", "S7.PROG.AREA_READ", "error", "user_program"),
    ("Hardware component removed or missing", "S7.HW.REMOVED", "error", "hardware"),
    ("Module/interface module removed, cannot be addressed", "S7.HW.REMOVED", "error", "hardware"),
    ("Module/interface module inserted, module type OK", "S7.HW.INSERTED", "info", "hardware"),
    ("STOP caused by programming error (OB not loaded or not possible)", "S7.STOP.PROGRAMMING_ERROR", "critical",
     "user_program"),
    ("STOP caused by stop switch being activated", "S7.STOP.SWITCH", "warning", "cpu"),
    ("DEFECTIVE: failure of clock chip", "S7.CPU.DEFECTIVE", "critical", "cpu"),
    ("I/O access error, reading", "S7.IO.ACCESS_READ", "error", "io"),
    ("Distributed I/Os: station failure, entering state", "S7.IO.STATION_FAILURE", "error", "io"),
    ("Distributed I/Os: station failure, leaving state", "S7.IO.STATION_RETURNED", "info", "io"),
    ("BATTF: failure on at least one backup battery of the central rack", "S7.POWER.BATTERY_FAILURE", "warning",
     "power"),
    ("BATTF: failure on at least one backup battery of the central rack, problem eliminated", "S7.POWER.BATTERY_OK",
     "info", "power"),
    ("Cycle time exceeded", "S7.CPU.CYCLE_TIME_EXCEEDED", "error", "cpu"),
    ("Module OK", "S7.HW.MODULE_OK", "info", "hardware"),
])
def test_s7_diagnostic_texts(text, code, severity, component):
    event = S7.parse_diagnostic(text, timestamp_ns=42)
    assert (event.code, event.severity, event.component) == (code, severity, component)
    assert (event.raw, event.vendor, event.timestamp_ns) == (text, "Siemens", 42)


def test_s7_mode_transition_text_names_both_modes():
    assert S7.parse_diagnostic("Mode transition from run to stop").text == "Mode transition from RUN to STOP"


def test_logix_every_major_and_minor_table_entry_is_reachable():
    data = load_data("controllogix.json")
    for key, entry in data["major_faults"].items():
        t, c = (int(part) for part in key.split("/"))
        texts = (f"Type {t:02d} Code {c:02d} {entry['text']}", f"(Type {t:02d}) Fault (Code {c:02d})", f"T{t:02d}:C{c}")
        for text in texts:
            event = LOGIX.parse_diagnostic(text)
            assert (event.code, event.severity, event.component) == (entry["code"], "critical", entry["component"])
    for key, entry in data["minor_faults"].items():
        t, c = (int(part) for part in key.split("/"))
        event = LOGIX.parse_diagnostic(f"Minor Error: (Type {t:02d}) Program Fault (Code {c:02d})")
        assert (event.code, event.severity) == (entry["code"], "warning")


def test_logix_fault_records():
    event = LOGIX.parse_diagnostic("(Type 04) Program Fault (Code 20) Array subscript too large, or CONTROL data "
                                   "type POS or LEN invalid")
    assert (event.code, event.severity, event.component) == ("LOGIX.MAJOR.T04.C20", "critical", "program")
    assert event.text == "Fault type 4 code 20: Invalid Array Subscript"
    minor = LOGIX.parse_diagnostic("Minor Error: (Type 04) Program Fault (Code 04) - Arithmetic overflow.")
    assert (minor.code, minor.severity) == ("LOGIX.MINOR.T04.C04", "warning")
    unlisted = LOGIX.parse_diagnostic("Type 04 Code 77 something new")
    assert (unlisted.code, unlisted.severity) == ("LOGIX.UNKNOWN", "warning")
    assert unlisted.text == "Unlisted fault type 4 code 77: Type 04 Code 77 something new"


def test_melsec_diagnostic_texts():
    assert MELSEC.parse_diagnostic("SM0 ON").code == "MELSEC.SM0.ON"
    assert MELSEC.parse_diagnostic("SM1=1").code == "MELSEC.SM1.ON"
    assert MELSEC.parse_diagnostic("SM0: OFF").code == "MELSEC.SM0.OFF"
    sd0 = MELSEC.parse_diagnostic("SD0=2220H")
    # No SD0 code table could be confirmed from a source: the code is kept, the meaning is not guessed.
    assert (sd0.code, sd0.severity, sd0.raw) == ("MELSEC.UNKNOWN", "warning", "SD0=2220H")
    assert "2220H" in sd0.text
    assert MELSEC.parse_diagnostic("error code 3c00").text.startswith("Self-diagnostic error code 3C00H")


@pytest.mark.parametrize("profile", [S7, LOGIX, MELSEC, SIM], ids=lambda p: p.name)
def test_unknown_text_is_kept_as_a_warning(profile):
    event = profile.parse_diagnostic("Zebra crossing on line 4", timestamp_ns=5)
    assert event == PlcEvent(f"{profile.prefix}.UNKNOWN", "warning", "unknown", "Zebra crossing on line 4", 5,
                             profile.vendor, "Zebra crossing on line 4")


@settings(max_examples=200)
@given(st.sampled_from([S7, LOGIX, MELSEC, SIM]), st.one_of(st.text(max_size=80), st.binary(max_size=8), st.none(),
                                                         st.integers()))
def test_diagnostics_and_status_never_raise(profile, raw):
    event = profile.parse_diagnostic(raw)
    assert event.severity in SEVERITIES and event.vendor == profile.vendor
    for ev in profile.decode_status(raw):
        assert ev.severity in SEVERITIES


# -- simulator ---------------------------------------------------------------------------------

def test_simulator_passthrough_matches_the_simulator_server():
    from plc.simulator.physics import SIGNALS
    from plc.simulator.server import COMMAND_NODE, NAMESPACE_URI
    for name in SIGNALS:
        assert SIM.node_id_for(name) == f"nsu={NAMESPACE_URI};s=RollingMill.{name}"
    assert SIM.node_id_for(COMMAND_NODE) == f"nsu={NAMESPACE_URI};s={COMMAND_NODE}"
    address = SIM.parse("roll_gap")
    assert address.kind == "tag" and SIM.parse_node_id(address.node_id) == address
    assert SIM.example_status() == () and SIM.example_diagnostics() == ()


def test_simulator_rejects_unusable_names():
    err = _error(SIM, "roll gap")
    assert (err.offset, err.reason) == (4, "character ' ' is not allowed in a simulator signal name")
    with pytest.raises(ProfileError) as info:
        SIM.parse_node_id("ns=2;s=RollingMill.roll_gap")
    assert info.value.offset == 0


# -- simulator tag layouts of the vendor profiles -------------------------------------------------------

SIMULATOR_VARIABLES = ("SensorFrame", "RollGapCommand", "SessionNonce", "SessionCredential", "Status", "Diagnostic")


@pytest.mark.parametrize("profile", [S7, LOGIX, MELSEC], ids=lambda p: p.name)
def test_simulator_tags_cover_the_simulator_in_normalized_vendor_addresses(profile):
    """Every simulator variable has one vendor address, written as the profile normalizes it, each at its own
    NodeId; node_id_for resolves the simulator's names (with or without RollingMill.) through that mapping."""
    from plc.simulator.physics import SIGNALS
    from plc.simulator.server import COMMAND_NODE

    tags = profile.simulator_tags()
    assert set(tags) == set(SIGNALS) | set(SIMULATOR_VARIABLES)
    node_ids = {}
    for name, address in tags.items():
        parsed = profile.parse(address)
        assert parsed.text == address, f"{name}: write {parsed.text!r}, the normalized form"
        assert profile.parse_node_id(parsed.node_id) == parsed
        assert profile.node_id_for(name) == profile.node_id_for("RollingMill." + name) == parsed.node_id
        node_ids[parsed.node_id] = name
    assert len(node_ids) == len(tags), "two simulator variables share a vendor address"
    assert profile.node_id_for(COMMAND_NODE) == profile.parse(tags["RollGapCommand"]).node_id
    data = load_data({"s7-1500": "s7_1500.json", "controllogix": "controllogix.json",
                      "melsec-iq-r": "melsec_iq_r.json"}[profile.name])
    assert "not a vendor fact" in data["simulator_tags"]["_doc"]


def test_node_id_for_parses_names_outside_the_mapping():
    assert S7.node_id_for("exit_thickness") == 'ns=3;s="DB_Line"."Thickness"'
    assert S7.node_id_for("DB_Line.Other") == 'ns=3;s="DB_Line"."Other"'
    assert MELSEC.node_id_for("D100.F") == "ns=2;s=D100.F"
    assert LOGIX.node_id_for("roll_gap") == "ns=2;s=[PLC]Program:Mill.RollGap"
    assert SIM.simulator_tags() == {} and SIM.node_id_for("roll_gap").endswith(";s=RollingMill.roll_gap")
