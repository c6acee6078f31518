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


RECIPE = LAYER / "recipes-sits/sits2026/sits2026_0.1.0.bb"


def _replay_do_install(root: Path, build: Path) -> dict[Path, tuple[int, str | None]]:
    """Replays the sits2026 recipe's do_install:append (install -d/-m/-g, sed ... > FILE) into a fake root
    without bitbake. Returns what each installed path was given: (mode, group or None). Groups are recorded,
    not applied: the build host has no sitsd group (in bitbake, useradd.bbclass puts it into the recipe's
    sysroot and pseudo resolves it)."""
    import shlex
    import shutil

    text = RECIPE.read_text()
    body = re.search(r"do_install:append\(\) \{\n(.*?)\n\}", text, re.S).group(1).replace("\\\n", " ")
    dirs = {"${D}": str(root), "${S}": str(REPO), "${B}": str(build), "${datadir}": "/usr/share",
            "${sysconfdir}": "/etc", "${localstatedir}": "/var",
            "${systemd_system_unitdir}": "/usr/lib/systemd/system", "${nonarch_libdir}": "/usr/lib"}

    def expand(word: str) -> str:
        for var, value in dirs.items():
            word = word.replace(var, value)
        return word

    given: dict[Path, tuple[int, str | None]] = {}
    for line in body.splitlines():
        words = [expand(w) for w in shlex.split(line.strip())]
        if not words:
            continue
        if words[0] == "install":
            mode, group, directory, rest, i = None, None, False, [], 1
            while i < len(words):
                w = words[i]
                if w == "-d":
                    directory = True
                elif w in ("-m", "-g", "-o"):
                    assert w != "-o", f"unexpected owner in {line!r}"  # files stay root-owned
                    mode, group = (int(words[i + 1], 8), group) if w == "-m" else (mode, words[i + 1])
                    i += 1
                else:
                    assert not w.startswith("-"), f"install option {w} not replayed: {line!r}"
                    rest.append(w)
                i += 1
            if directory:
                for d in map(Path, rest):
                    d.mkdir(parents=True, exist_ok=True)
                    if mode is not None:
                        d.chmod(mode)
                    given[d] = (mode if mode is not None else 0o755, group)
            else:
                assert mode is not None, f"install without -m: {line!r}"
                *sources, dest = rest
                for src in sources:
                    target = Path(dest) / Path(src).name if dest.endswith("/") or len(sources) > 1 else Path(dest)
                    shutil.copyfile(src, target)
                    target.chmod(mode)
                    given[target] = (mode, group)
        elif words[0] == "sed":
            assert words[-2] == ">", f"the recipe's sed writes a new file: {line!r}"
            exprs = [words[i + 1] for i, w in enumerate(words) if w == "-e"]
            content = Path(words[-3]).read_text()
            for expr in exprs:
                _, old, new, _ = expr.split("#")
                assert old in content, f"the recipe's sed expects {old!r} in the example config"
                content = content.replace(old, new.replace("/usr/share", str(root / "usr/share")))
            Path(words[-1]).write_text(content)
        else:
            raise AssertionError(f"do_install line not replayed: {line!r}")
    return given


def test_the_installed_config_loads_with_the_installed_files(tmp_path):
    """Replays the sits2026 recipe's do_install into a fake root, then loads /etc/sits2026/sitsd.yaml there:
    every path the config names must exist where it was installed."""
    from sitsd.config import load_config

    root, build = tmp_path / "image", tmp_path / "build"
    build.mkdir()
    _replay_do_install(root, build)
    cfg = load_config(root / "etc/sits2026/sitsd.yaml")
    assert str(cfg.model.artifact).startswith(str(root / "usr/share/sits2026"))
    assert cfg.modules and all(str(m.path).startswith(str(root / "usr/share/sits2026")) for m in cfg.modules)
    assert cfg.attestation.approval and cfg.attestation.approval.is_file()
    assert (root / "usr/lib/systemd/system/var-lib-sitsd.mount").is_file()
    assert (root / "var/lib/sitsd").is_dir()  # the data partition's mount point exists on the read-only root


def test_the_daemon_can_read_what_the_recipe_installs_under_etc(tmp_path):
    """sitsd runs as User=sitsd Group=sitsd: everything under /etc/sits2026 must reach it through the group
    (root-owned, group sitsd, group-readable, nothing for others), with the mode sitsd.tmpfiles declares for
    /etc/sits2026 itself (tmpfiles cannot fix it on the image's read-only /etc)."""
    root, build = tmp_path / "image", tmp_path / "build"
    build.mkdir()
    given = _replay_do_install(root, build)
    unit = (REPO / "systemd" / "sitsd.service").read_text()
    group = re.search(r"^Group=(\S+)", unit, re.M).group(1)
    etc = root / "etc/sits2026"
    below = sorted(p for p in etc.rglob("*"))
    assert {"sitsd.yaml", "approval", "rolling-mill.approval.json", "authority.pub.pem"} <= {p.name for p in below}
    for path in [etc, *below]:
        assert path in given, f"{path.relative_to(root)} was not installed with an explicit mode"
        mode, grp = given[path]
        rel = "/" + str(path.relative_to(root))
        assert grp == group, f"{rel}: group {grp}, the daemon runs as group {group}"
        needed = 0o050 if path.is_dir() else 0o040
        assert mode & needed == needed, f"{rel}: mode {mode:o} does not let group {group} read it"
        assert mode & 0o007 == 0, f"{rel}: mode {mode:o} lets others in"
        assert path.stat().st_mode & 0o777 == mode
    tmpfiles = (REPO / "systemd" / "sitsd.tmpfiles").read_text()
    (mode, owner, grp), = re.findall(r"^d /etc/sits2026 (\d+) (\S+) (\S+)", tmpfiles, re.M)
    assert (int(mode, 8), grp) == given[etc] and owner == "root"


def test_the_mount_unit_is_packaged_and_enabled_apart_from_the_daemon():
    text = re.sub(r"\\\n", " ", RECIPE.read_text())
    v = _vars(text)
    assert re.search(r'^PACKAGES =\+ "\$\{PN\}-datapart"$', text, re.M)  # prepended: it gets the unit first
    assert set(v["SYSTEMD_PACKAGES"].split()) == {"${PN}", "${PN}-datapart"}
    assert v["SYSTEMD_SERVICE:${PN}-datapart"] == "var-lib-sitsd.mount"
    assert v["SYSTEMD_AUTO_ENABLE:${PN}-datapart"] == "enable"
    assert "e2fsprogs-e2fsck" in v["RDEPENDS:${PN}-datapart"].split()  # systemd-fsck needs fsck.ext4


def test_the_image_makes_the_data_partition_the_mount_unit_mounts():
    """sits-image's kickstart has an ext4 partition with the label var-lib-sitsd.mount waits for, and the
    image installs the package with the mount unit; the rootfs stays read-only."""
    image = (LAYER / "recipes-core/images/sits-image.bb").read_text()
    v = _vars(image)
    assert "read-only-rootfs" in v["IMAGE_FEATURES"].split()
    assert "sits2026-datapart" in v["IMAGE_INSTALL"].split()
    assert "wic" in v["IMAGE_FSTYPES"].split()
    wks = LAYER / "wic" / v["WKS_FILE"]
    assert wks.is_file(), f"WKS_FILE {v['WKS_FILE']} is not in the layer's wic/ directory"
    mount = (REPO / "systemd" / "var-lib-sitsd.mount").read_text()
    label = re.search(r"^What=/dev/disk/by-label/(\S+)$", mount, re.M).group(1)
    parts = [line for line in wks.read_text().splitlines() if line.startswith("part ")]
    (data,) = [p for p in parts if f"--label {label} " in p + " "]
    assert "--fstype=ext4" in data and "--source" not in data, data  # empty, formatted by wic
    assert not re.match(r"part /", data), "a mount point would make wic add an fstab line next to the mount unit"
    assert re.search(r"^Type=ext4$", mount, re.M)
    for var in re.findall(r"\$\{(SITS_\w+)\}", wks.read_text()):
        assert re.search(rf"^{var} \??=", image, re.M), f"{var} (used by {wks.name}) is not set in sits-image.bb"
