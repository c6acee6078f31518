"""docs/alerts.md has a section for every alert kind the daemon can raise, and none for a kind it does not
know. Kinds are read from the source with `ast`, not listed by hand: a new alert without its operator's
section fails here."""
import ast
import re

from ..conftest import REPO

DOC = REPO / "docs" / "alerts.md"
SOURCES = sorted((REPO / "sitsd").rglob("*.py")) + sorted((REPO / "plc").rglob("*.py"))


def _module_constants(tree: ast.Module) -> dict[str, str]:
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


def _kinds_raised() -> dict[str, set[str]]:
    """kind -> files, from: `<x>.alerts.append((t, KIND, ...))` and `alerts.append(...)` on a local list,
    `<x>._alert(KIND, ...)` (the daemon's helper), and `alert_counts["kind"] += n` (counted-only kinds;
    `alert_counts[kind]` with a variable is the consumer counting what the others queued).
    KIND is a string literal or a module-level string constant; any other form fails the test, so that
    an alert kind cannot hide behind an expression this test does not read."""
    found: dict[str, set[str]] = {}
    unreadable = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        consts = _module_constants(tree)
        rel = str(path.relative_to(REPO))

        def kind_of(node: ast.expr, where: str):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value
            if isinstance(node, ast.Name) and node.id in consts:
                return consts[node.id]
            unreadable.append(f"{rel}:{where}: alert kind {ast.unparse(node)!r} is not a literal or constant")
            return None

        helpers = set()  # functions that take the kind as a parameter and append it (the daemon's _alert)
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.args.args[1:2] \
                    and fn.args.args[1].arg == "kind":
                helpers.add(fn)
        helper_nodes = {id(n) for fn in helpers for n in ast.walk(fn)}
        for node in ast.walk(tree):
            kind = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if node.func.attr == "append" and name == "alerts" and node.args \
                        and isinstance(node.args[0], ast.Tuple) and id(node) not in helper_nodes:
                    kind = kind_of(node.args[0].elts[1], str(node.lineno))
                elif node.func.attr == "_alert" and len(node.args) >= 2:
                    kind = kind_of(node.args[0], str(node.lineno))
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "alert_counts" and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.slice, ast.Constant):  # alert_counts[kind]: the generic consumer
                kind = kind_of(node.slice, str(node.lineno))
            if kind is not None:
                found.setdefault(kind, set()).add(rel)
    assert not unreadable, "\n".join(unreadable)
    return found


def _documented() -> list[str]:
    return re.findall(r"^### `([a-z_]+)`$", DOC.read_text(), re.M)


def test_the_source_scan_finds_the_alerts_everyone_knows():
    """Guards the scan itself: if it stopped finding these, the next test would pass for nothing."""
    kinds = _kinds_raised()
    assert {"audit", "plc_link", "frame_timeout", "sign", "loop_crashed", "timestamp", "constraint",
            "persisted_update", "malformed_frame"} <= set(kinds), sorted(kinds)


def test_every_alert_kind_has_a_section_in_docs_alerts():
    from sitsd.rca.events import _ALERT_KINDS

    documented = _documented()
    assert len(documented) == len(set(documented)), "a kind has two sections"
    raised = _kinds_raised()
    missing = {k: sorted(v) for k, v in raised.items() if k not in documented}
    missing.update({k: ["sitsd/rca/events.py _ALERT_KINDS"] for k in _ALERT_KINDS if k not in documented})
    assert not missing, f"alert kinds without a section (### `kind`) in docs/alerts.md: {missing}"
    stale = set(documented) - set(raised) - set(_ALERT_KINDS)
    assert not stale, f"docs/alerts.md documents kinds nothing raises or knows: {sorted(stale)}"


def test_each_section_says_what_it_means_does_and_where_it_shows():
    text = DOC.read_text()
    sections = re.split(r"^### ", text, flags=re.M)[1:]
    raised = set(_kinds_raised())
    for section in sections:
        kind = re.match(r"`([a-z_]+)`", section).group(1)
        if kind not in raised:
            continue  # known to fault attribution only: a short note suffices
        for part in ("**Means.**", "**Meanwhile.**", "**Likely causes.**", "**What to do.**", "**Shows in.**"):
            assert part in section, f"docs/alerts.md, {kind}: no {part}"


def test_operations_and_readme_link_the_alerts_page():
    assert "docs/alerts.md" in (REPO / "README.md").read_text()
    assert "alerts.md" in (REPO / "docs" / "operations.md").read_text()
