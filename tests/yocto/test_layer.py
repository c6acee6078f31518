"""Structure of the meta-sits layer: what bitbake would trip over first, checked without bitbake."""
import re
from pathlib import Path

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


def test_the_installed_config_loads_with_the_installed_files(tmp_path):
    """Replays the sits2026 recipe's do_install (install -d/-m and its sed) into a fake root, then
    loads /etc/sits2026/sitsd.yaml there: every path the config names must exist where it was installed."""
    import shlex
    import shutil

    from sitsd.config import load_config

    root = tmp_path / "image"
    text = (LAYER / "recipes-sits/sits2026/sits2026_0.1.0.bb").read_text()
    body = re.search(r"do_install:append\(\) \{\n(.*?)\n\}", text, re.S).group(1).replace("\\\n", " ")
    dirs = {"${D}": str(root), "${S}": str(REPO), "${datadir}": "/usr/share", "${sysconfdir}": "/etc",
            "${systemd_system_unitdir}": "/usr/lib/systemd/system", "${nonarch_libdir}": "/usr/lib"}

    def expand(word: str) -> str:
        for var, value in dirs.items():
            word = word.replace(var, value)
        return word

    for line in body.splitlines():
        words = [expand(w) for w in shlex.split(line.strip())]
        if words[:2] == ["install", "-d"]:
            for d in words[2:]:
                Path(d).mkdir(parents=True, exist_ok=True)
        elif words[:2] == ["install", "-m"]:
            *sources, dest = words[3:]
            for src in sources:
                target = Path(dest) / Path(src).name if dest.endswith("/") or len(sources) > 1 else Path(dest)
                shutil.copy(src, target)
        elif words[:1] == ["sed"]:
            exprs = [words[i + 1] for i, w in enumerate(words) if w == "-e"]
            target = Path(words[-1])
            content = target.read_text()
            for expr in exprs:
                _, old, new, _ = expr.split("#")
                assert old in content, f"the recipe's sed expects {old!r} in the example config"
                content = content.replace(old, new.replace("/usr/share", str(root / "usr/share")))
            target.write_text(content)
    cfg = load_config(root / "etc/sits2026/sitsd.yaml")
    assert str(cfg.model.artifact).startswith(str(root / "usr/share/sits2026"))
    assert cfg.modules and all(str(m.path).startswith(str(root / "usr/share/sits2026")) for m in cfg.modules)
    assert cfg.attestation.approval and cfg.attestation.approval.is_file()
