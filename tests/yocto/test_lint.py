"""The layer passes oelint-adv for every release it declares, and every runtime dependency has a provider.

oelint-adv runs without network lookups: its only networked rule (HOMEPAGE reachability) is
suppressed, everything else is on, in `--mode all`. Findings of severity info are allowed;
warnings and errors fail the test with the linter's own message.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO

LAYER = REPO / "yocto" / "meta-sits"
RECIPES = sorted(LAYER.glob("recipes-*/*/*.bb")) + sorted(LAYER.glob("recipes-*/*/*.bbappend"))
OELINT = Path(sys.executable).with_name("oelint-adv")


def _compat_releases() -> list[str]:
    conf = (LAYER / "conf" / "layer.conf").read_text()
    return re.search(r'LAYERSERIES_COMPAT_sits = "([^"]+)"', conf).group(1).split()


@pytest.mark.parametrize("release", _compat_releases())
def test_oelint_adv_finds_no_warnings_or_errors(release):
    assert OELINT.exists() or shutil.which("oelint-adv"), "oelint-adv missing: install the test extra"
    exe = str(OELINT) if OELINT.exists() else shutil.which("oelint-adv")
    r = subprocess.run([exe, "--release", release, "--mode", "all", "--relpaths", "--quiet", "--jobs", "1",
                        "--suppress", "oelint.vars.homepageping", *map(str, RECIPES)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    findings = [line for line in (r.stdout + r.stderr).splitlines()
                if re.search(r":(warning|error):", line)]
    assert not findings, "\n".join(findings)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


def test_layer_conf_gives_scarthgap_an_unpackdir():
    conf = (LAYER / "conf" / "layer.conf").read_text()
    # weak default: later releases' bitbake.conf (parsed after layer.conf) overrides it
    assert re.search(r'^UNPACKDIR \?\?= "\$\{WORKDIR\}"$', conf, re.M)
    assert "scarthgap" in _compat_releases()


def _rdepends() -> dict[str, set[str]]:
    """Every RDEPENDS entry of every recipe, with the recipes that name it."""
    found: dict[str, set[str]] = {}
    for recipe in RECIPES:
        text = re.sub(r"\\\n", " ", recipe.read_text())
        for m in re.finditer(r'^RDEPENDS:\$\{PN\}[\w:${}-]*\s*[+:.]?=\s*"([^"]*)"', text, re.M):
            for name in m.group(1).split():
                found.setdefault(name, set()).add(recipe.name)
    return found


def _readme_providers() -> tuple[dict[str, str], set[str]]:
    readme = (LAYER / "README.md").read_text()
    table = dict(re.findall(r"^\| `([^`]+)` \| ([^|]+?) \|$", readme, re.M))
    named = set(re.findall(r"^- `([^`]+)`", readme, re.M))
    return table, named


def test_every_rdepends_is_provided_by_this_layer_or_a_layer_the_readme_names():
    own = {re.sub(r"_[^_]*$", "", p.stem) for p in RECIPES}
    table, named = _readme_providers()
    assert named, "README.md lists no layers (lines '- `layer` ...')"
    missing = []
    for name, users in sorted(_rdepends().items()):
        if name in own:
            continue
        layer = table.get(name)
        if layer is None:
            missing.append(f"{name} (needed by {', '.join(sorted(users))}) is not in README.md's provider table")
        elif layer.strip("`") not in named:
            missing.append(f"{name}: provider {layer} is not one of the layers README.md names: {sorted(named)}")
    assert not missing, "\n".join(missing)


def test_the_provider_table_has_no_stale_rows():
    """A row for a package nothing depends on any more is noise that hides real gaps."""
    table, _ = _readme_providers()
    used = set(_rdepends())
    assert not set(table) - used, sorted(set(table) - used)


def test_layerdepends_covers_the_mainstream_layers_the_readme_names():
    conf = (LAYER / "conf" / "layer.conf").read_text()
    deps = set(re.search(r'LAYERDEPENDS_sits = "([^"]+)"', conf).group(1).split())
    _, named = _readme_providers()
    collections = {"openembedded-core": "core", "meta-oe": "openembedded-layer", "meta-python": "meta-python",
                   "meta-tpm": "tpm-layer"}
    for layer, collection in collections.items():
        if layer in named:
            assert collection in deps, f"{layer} is named in README.md but {collection} is not in LAYERDEPENDS_sits"
