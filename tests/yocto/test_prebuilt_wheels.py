"""The prebuilt-wheel recipes (classes-recipe/sits_prebuilt_wheel.bbclass) are complete for what they claim.

Every (architecture, CPython version) a recipe claims must have its own 64-hex sha256 varflag, with no
stale ones left over, and COMPATIBLE_HOST must admit exactly the architectures that have a wheel. The
class's parse-time function is also run here against a small stand-in for BitBake's datastore: it must
pick the checksum of the wheel it fetches, name that wheel correctly, and skip the recipe with a reason
for a Python or architecture without a wheel instead of leaving it to a checksum error at fetch time.
No network: the checksums themselves were taken from PyPI when the recipes were written.
"""
from __future__ import annotations

import re
import textwrap
import types

import pytest

from ..conftest import REPO

LAYER = REPO / "yocto" / "meta-sits"
CLASS = LAYER / "classes-recipe" / "sits_prebuilt_wheel.bbclass"
WHEEL_RECIPES = sorted(p for p in LAYER.glob("recipes-*/*/*.bb")
                       if re.search(r"^inherit .*\bsits_prebuilt_wheel\b", p.read_text(), re.M))
# TARGET_ARCH as BitBake's overrides spell it (TRANSLATED_TARGET_ARCH) -> the arch in HOST_SYS
ARCHS = {"x86-64": "x86_64", "aarch64": "aarch64"}
RELEASE_PYTHONS = ("3.12", "3.13", "3.14")  # scarthgap 3.12, walnascar/whinlatter 3.13, wrynose 3.13 or 3.14


class SkipRecipe(Exception):
    pass


def _joined(text: str) -> str:
    return re.sub(r"\\\n", " ", text)


def _assignments(text: str) -> list[tuple[str, str | None, str, str]]:
    """(name, override, operator, value) of every plain `NAME[:override] op "value"` line."""
    return [(m.group(1), m.group(2), m.group(3), m.group(4)) for m in
            re.finditer(r'^([A-Z][A-Z0-9_]*)(?::([\w-]+))?\s*(\?=|=)\s*"(.*)"\s*$', _joined(text), re.M)]


def _flags(text: str) -> dict[tuple[str, str], str]:
    return {(m.group(1), m.group(2)): m.group(3) for m in
            re.finditer(r'^([A-Z][A-Z0-9_]*)\[([\w.+-]+)\]\s*=\s*"(.*)"\s*$', _joined(text), re.M)}


def _sha_flags(text: str) -> dict[str, str]:
    return {flag[: -len(".sha256sum")]: value for (var, flag), value in _flags(text).items()
            if var == "SRC_URI" and flag.endswith(".sha256sum")}


class FakeData:
    """Just enough of bb.data_smart for the class: getVar/getVarFlag with ${VAR} and ${@...} expansion."""

    def __init__(self, variables: dict[str, str], flags: dict[tuple[str, str], str], functions: dict):
        self.vars, self.flags, self.functions = dict(variables), dict(flags), functions

    def expand(self, value: str) -> str:
        for _ in range(20):
            new = re.sub(r"\$\{@([^}]*)\}", lambda m: str(eval(m.group(1), {**self.functions, "d": self})), value)
            new = re.sub(r"\$\{([A-Za-z0-9_]+)\}",
                         lambda m: self.getVar(m.group(1)) if m.group(1) in self.vars else m.group(0), new)
            if new == value:
                return new
            value = new
        raise AssertionError(f"expansion does not settle: {value}")

    def getVar(self, name: str, expand: bool = True):  # noqa: N802 (BitBake's API)
        value = self.vars.get(name)
        return self.expand(value) if value is not None and expand else value

    def getVarFlag(self, name: str, flag: str, expand: bool = True):  # noqa: N802
        value = self.flags.get((name, flag))
        return self.expand(value) if value is not None and expand else value

    def setVarFlag(self, name: str, flag: str, value: str):  # noqa: N802
        self.flags[(name, flag)] = value


def _class_parts():
    text = CLASS.read_text()
    functions: dict = {}
    for m in re.finditer(r"^def .*?(?=^\S)", text, re.M | re.S):
        exec(m.group(0), functions)  # noqa: S102 (the layer's own helper functions)
    functions.pop("__builtins__", None)
    anon = re.search(r"^python __anonymous\(\) \{\n(.*?)^\}", text, re.M | re.S).group(1)
    return text, functions, textwrap.dedent(anon)


def _datastore(recipe, arch: str, python: str) -> FakeData:
    """The class's variables then the recipe's, as BitBake would see them for TARGET_ARCH=arch."""
    class_text, functions, _ = _class_parts()
    pn, pv = recipe.stem.split("_", 1)
    variables = {"PN": pn, "BPN": pn, "PV": pv, "PYTHON_BASEVERSION": python, "TRANSLATED_TARGET_ARCH": arch,
                 "UNPACKDIR": "/unpack"}
    flags = {}
    for text in (class_text, recipe.read_text()):
        overridden = {}
        for name, override, op, value in _assignments(text):
            if override is None:
                if op == "=" or name not in variables:
                    variables[name] = value
            elif override == arch:
                overridden[name] = value
        variables.update(overridden)  # an active override wins over the plain assignment
        flags.update(_flags(text))
    return FakeData(variables, flags, functions)


def _run_anonymous(d: FakeData):
    _, _, anon = _class_parts()
    bb = types.SimpleNamespace(parse=types.SimpleNamespace(SkipRecipe=SkipRecipe))
    exec(anon, {"d": d, "bb": bb})  # noqa: S102


def _claims(recipe) -> tuple[list[str], list[str]]:
    d = _datastore(recipe, "x86-64", "3.12")
    pythons = (d.getVar("SITS_WHEEL_PYTHONS") or "").split()
    archs = sorted(o for n, o, _, _ in _assignments(recipe.read_text()) if n == "SITS_WHEEL_PLATFORM" and o)
    return pythons, archs


def test_the_wheel_recipes_use_the_class():
    names = {p.name for p in WHEEL_RECIPES}
    assert {"python3-wasmtime_50.0.1.bb", "python3-onnxruntime_1.32.0.bb", "python3-onnx_1.23.2.bb",
            "python3-ml-dtypes_0.6.0.bb"} <= names, names
    for recipe in WHEEL_RECIPES:
        text = recipe.read_text()
        # the class owns fetching: a recipe inheriting pypi would add the sdist to SRC_URI (SRC_URI:prepend)
        assert not re.search(r"^inherit .*\bpypi\b", text, re.M), recipe.name
        assert not re.search(r"^SRC_URI\s*[+:.?]*=", text, re.M), recipe.name
        assert re.search(r'^SITS_WHEEL_LICENSE_FILES = "\S', text, re.M), recipe.name


@pytest.mark.parametrize("recipe", WHEEL_RECIPES, ids=lambda p: p.name)
def test_every_claimed_arch_and_python_has_a_checksum(recipe):
    pythons, archs = _claims(recipe)
    assert archs == sorted(ARCHS), f"{recipe.name}: wheels for {archs}, expected {sorted(ARCHS)}"
    sums = _sha_flags(recipe.read_text())
    needed = set()
    for arch in archs:
        for python in pythons or RELEASE_PYTHONS:
            d = _datastore(recipe, arch, python)
            needed.add(f"{arch}-{d.getVar('SITS_WHEEL_PYTAG')}")
    missing = needed - set(sums)
    assert not missing, f"{recipe.name}: no SRC_URI[<key>.sha256sum] for {sorted(missing)}"
    assert not set(sums) - needed, f"{recipe.name}: checksums for wheels it never fetches: {sorted(set(sums) - needed)}"
    bad = {k: v for k, v in sums.items() if not re.fullmatch(r"[0-9a-f]{64}", v)}
    assert not bad, bad
    assert len(set(sums.values())) == len(sums), f"{recipe.name}: two wheels with one checksum"


@pytest.mark.parametrize("recipe", WHEEL_RECIPES, ids=lambda p: p.name)
def test_the_class_picks_the_wheel_and_its_checksum(recipe):
    pythons, archs = _claims(recipe)
    sums = _sha_flags(recipe.read_text())
    for arch in archs:
        for python in pythons or RELEASE_PYTHONS:
            d = _datastore(recipe, arch, python)
            _run_anonymous(d)
            pytag, abitag = d.getVar("SITS_WHEEL_PYTAG"), d.getVar("SITS_WHEEL_ABITAG")
            assert d.getVarFlag("SRC_URI", "sha256sum") == sums[f"{arch}-{pytag}"]
            wheel = d.getVar("SITS_WHEEL_FILE")
            dist, pv = d.getVar("SITS_WHEEL_DIST"), d.getVar("PV")
            m = re.fullmatch(rf"{re.escape(dist)}-{re.escape(pv)}-(\w+)-(\w+)-([\w.]+)\.whl", wheel)
            assert m, wheel
            assert m.group(1) == pytag and m.group(2) == abitag, wheel
            if pytag.startswith("cp") and abitag != "abi3":  # per-interpreter wheel: the image's CPython
                assert pytag == "cp" + python.replace(".", ""), wheel
            platforms = m.group(3).split(".")
            assert all(p.endswith("_" + ARCHS[arch]) and p.startswith("manylinux") for p in platforms), wheel
            uri = d.getVar("SRC_URI")
            project = d.getVar("SITS_WHEEL_PROJECT")
            assert uri == (f"https://files.pythonhosted.org/packages/{pytag}/{project[0]}/{project}/{wheel}"
                           ";unpack=0;subdir=wheel"), uri


@pytest.mark.parametrize("recipe", [p for p in WHEEL_RECIPES if _claims(p)[0]], ids=lambda p: p.name)
@pytest.mark.parametrize("python", ["3.11", "3.15"])
def test_an_unsupported_python_skips_the_recipe_with_a_reason(recipe, python):
    d = _datastore(recipe, "aarch64", python)
    with pytest.raises(SkipRecipe) as info:
        _run_anonymous(d)
    assert f"is {python}" in str(info.value) and "3.12" in str(info.value), info.value
    assert d.getVarFlag("SRC_URI", "sha256sum") is None


@pytest.mark.parametrize("recipe", WHEEL_RECIPES, ids=lambda p: p.name)
def test_an_architecture_without_a_wheel_skips_the_recipe(recipe):
    d = _datastore(recipe, "riscv64", "3.13")
    with pytest.raises(SkipRecipe, match="no prebuilt wheel for riscv64"):
        _run_anonymous(d)


def test_compatible_host_admits_exactly_the_wheel_architectures():
    pattern = dict((n, v) for n, _, _, v in _assignments(CLASS.read_text()))["COMPATIBLE_HOST"]
    for recipe in WHEEL_RECIPES:
        assert "COMPATIBLE_HOST" not in recipe.read_text(), f"{recipe.name} overrides the class's COMPATIBLE_HOST"
    for host in ("x86_64-poky-linux", "aarch64-poky-linux", "x86_64-oe-linux", "aarch64-linux"):
        assert re.match(pattern, host), host  # base.bbclass: re.match(COMPATIBLE_HOST, HOST_SYS)
    # manylinux wheels need glibc and the LP64 little-endian ABI
    for host in ("arm-poky-linux-gnueabi", "riscv64-poky-linux", "x86_64-poky-linux-musl",
                 "x86_64-poky-linux-gnux32", "aarch64_be-poky-linux", "aarch64-poky-linux-musl",
                 "i686-poky-linux", "aarch64-poky-linux-gnu_ilp32"):
        assert not re.match(pattern, host), host


def test_readme_names_no_unnamed_vendor_layer_as_a_provider():
    readme = (LAYER / "README.md").read_text()
    assert "vendor ML layer" not in readme
    table = dict(re.findall(r"^\| `([^`]+)` \| ([^|]+?) \|$", readme, re.M))
    named = set(re.findall(r"^- `([^`]+)`", readme, re.M))
    for package in ("python3-onnxruntime", "python3-onnx", "python3-ml-dtypes"):
        assert table.get(package) == "this layer", (package, table.get(package))
    vague = {k: v for k, v in table.items() if v != "this layer" and v.strip("`") not in named}
    assert not vague, vague
