"""Structure of the meta-sits layer: what bitbake would trip over first, checked without bitbake."""
import re

import pytest

from ..conftest import REPO

LAYER = REPO / "yocto" / "meta-sits"
RECIPES = sorted(LAYER.glob("recipes-*/*/*.bb"))


def _vars(text: str) -> dict[str, str]:
    joined = re.sub(r"\\\n", " ", text)
    return {m.group(1): m.group(2) for m in re.finditer(r'^([A-Za-z0-9_:${}\-\[\]]+)\s*[?+.:]?=\s*"(.*)"\s*$', joined, re.M)}


def test_layer_conf_declares_the_collection():
    conf = (LAYER / "conf" / "layer.conf").read_text()
    assert 'BBFILE_COLLECTIONS += "sits"' in conf
    assert re.search(r'LAYERSERIES_COMPAT_sits = ".*wrynose', conf)


def test_recipes_exist_and_are_named_name_version():
    names = {p.name for p in RECIPES}
    assert {"sits2026_0.1.0.bb", "packagegroup-sits.bb", "sits-image.bb"} <= names
    for p in RECIPES:
        assert re.match(r"^[a-z0-9][a-z0-9.+-]*(_[0-9][0-9A-Za-z.+-]*)?\.bb$", p.name), p.name


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_has_mandatory_variables_and_modern_syntax(recipe):
    text = recipe.read_text()
    v = _vars(text)
    for key in ("SUMMARY", "DESCRIPTION", "LICENSE"):
        assert v.get(key), f"{recipe.name}: {key} missing"
    if "inherit pypi" in text:  # a literal sha256, or one per architecture for prebuilt wheels
        sums = re.findall(r'^SRC_URI\[(?:[\w-]+\.)?sha256sum\] = "([^"]+)"', text, re.M)
        literal = [s for s in sums if not s.startswith("${@")]
        assert literal and all(re.fullmatch(r"[0-9a-f]{64}", s) for s in literal), sums
    if "packagegroup" not in text and "core-image" not in text:
        assert re.search(r'LIC_FILES_CHKSUM = "file://\S+;md5=[0-9a-f]{32}', text)
    assert not re.search(r"_(append|prepend|remove)\b", text), "old override syntax"
    assert "${WORKDIR}/git" not in text


def test_sits2026_recipe_installs_files_that_exist():
    text = (LAYER / "recipes-sits/sits2026/sits2026_0.1.0.bb").read_text()
    for rel in re.findall(r"\$\{S\}/(\S+)", text):
        assert (REPO / rel).is_file(), rel
    assert (REPO / "LICENSE").is_file()
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert f"sits2026_{version}.bb" in {p.name for p in RECIPES}
