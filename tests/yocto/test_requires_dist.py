"""RDEPENDS against what the Python code needs: the installed wheels' metadata, and the standard library's split.

1. Requires-Dist. For every recipe in this layer that packages a Python distribution (python3-*.bb, and sits2026
   itself), the distribution installed in this environment (importlib.metadata; the same version as the recipe) is
   read, and each Requires-Dist whose marker holds on the image (Linux, CPython 3.12 to 3.14 on x86_64 or aarch64;
   no extra) must be in the recipe's RDEPENDS:${PN} as python3-<name>, or in NOT_NEEDED with the reason. Names are
   PEP 503-normalised; PACKAGE_NAMES maps the few whose recipe is named otherwise. So a wheel that gains a dependency
   (asyncua's anyio) fails here, not on the device.
2. The claims in NOT_NEEDED are checked: importing what sits2026 imports of that distribution, in a fresh interpreter,
   loads none of the modules of the dependency left out (or, for an optional backend, works without it).
3. The standard library. openembedded-core splits CPython into packages (python3-core, python3-json,
   python3-multiprocessing, ...; meta/recipes-devtools/python/python3/python3-manifest.json). Every standard-library
   module that sitsd, attestation, ep or plc import anywhere (top level or inside a function) is looked up in
   STDLIB_PACKAGE, and its package must be in the sits2026 recipe's own RDEPENDS (not merely pulled in by another
   package's): a module missing from the table fails, so that a new import is classified once.

The marker environment is the image's, not this machine's: wait-for2 (asyncua, Python < 3.12 only) is not required
there, while mclbn256 (sits2026, x86_64 only) is.
"""
from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..conftest import REPO

LAYER = REPO / "yocto" / "meta-sits"
RECIPES = sorted(LAYER.glob("recipes-*/*/*.bb"))
# The image's CPythons: those the prebuilt-wheel recipes exist for (SITS_WHEEL_PYTHONS; another version skips them)
IMAGE_PYTHONS = tuple(sorted({v for r in RECIPES for m in re.finditer(r'^SITS_WHEEL_PYTHONS = "([^"]+)"',
                                                                        r.read_text(), re.M) for v in m.group(1).split()},
                             key=lambda v: tuple(map(int, v.split(".")))))
IMAGE_MACHINES = ("x86_64", "aarch64")
SOURCE_PACKAGES = ("sitsd", "attestation", "ep", "plc")  # what the sits2026 recipe installs (pyproject.toml)

# PEP 503 name -> the package that provides it, where that is not python3-<name>.
PACKAGE_NAMES = {
    "python-dateutil": "python3-dateutil",  # openembedded-core's recipe drops the "python-" prefix
    "z3-solver": "python3-z3",  # meta-oe's z3 recipe packages the bindings as python3-z3
}

# (distribution, requirement) -> why the recipe leaves it out. Each is checked by test_what_is_left_out_is_not_loaded.
NOT_NEEDED = {
    ("onnxruntime", "flatbuffers"): "imported only by onnxruntime.tools (ORT format conversion)",
    ("onnxruntime", "packaging"): "imported only by onnxruntime.quantization/.transformers; the sits2026 recipe "
                                  "depends on python3-packaging for sitsctl compile --quantization int8",
    ("onnxruntime", "protobuf"): "imported only by onnxruntime.tools/.transformers (python3-onnx brings it for "
                                 "sitsctl compile)",
    ("py-ecc", "eth-typing"): "imported only by py_ecc.bls; sits2026 imports py_ecc.optimized_bn128",
    ("py-ecc", "eth-utils"): "imported only by py_ecc.bls; sits2026 imports py_ecc.optimized_bn128",
    ("sits2026", "mclbn256"): "optional native MSM/pairing backend (x86_64 wheel embedding libmcl, no recipe): "
                              "attestation.zk.backend falls back to gmpy2 and py_ecc without it (proofs and "
                              "verification slower, results the same)",
}

# What importing a distribution means for sits2026 (the modules it imports of it), for the checks of NOT_NEEDED.
IMPORTED_AS = {"onnxruntime": "import onnxruntime", "py-ecc": "from py_ecc import optimized_bn128"}

# Standard-library module -> openembedded-core package (python3-manifest.json; "core" is python3-core, which every
# Python recipe gets through the python3 classes). Built-in modules (sys.builtin_module_names) need no entry.
STDLIB_PACKAGE = {
    **dict.fromkeys((
        "__future__", "abc", "argparse", "ast", "bisect", "bz2", "codecs", "collections", "contextlib", "copy",
        "copyreg", "csv", "dataclasses", "dis", "enum", "fcntl", "fnmatch", "functools", "getopt", "gettext", "glob",
        "grp", "heapq", "importlib", "inspect", "io", "ipaddress", "keyword", "linecache", "locale", "lzma", "math",
        "opcode", "operator", "optparse", "os", "pathlib", "pkgutil", "platform", "posixpath", "re", "reprlib",
        "runpy", "select", "selectors", "shutil", "signal", "site", "stat", "struct", "subprocess", "sysconfig",
        "textwrap", "threading", "token", "tokenize", "traceback", "types", "typing", "unicodedata", "urllib.parse",
        "warnings", "weakref", "zipimport", "zlib"), "core"),
    "importlib.metadata": "python3-email",  # in python3-core's importlib/, but parses METADATA with email
    "asyncio": "python3-asyncio", "concurrent.futures": "python3-asyncio",
    "gzip": "python3-compression", "tarfile": "python3-compression", "zipfile": "python3-compression",
    "hashlib": "python3-crypt",
    "ctypes": "python3-ctypes",
    "calendar": "python3-datetime", "datetime": "python3-datetime",
    "email": "python3-email",
    "socket": "python3-io", "ssl": "python3-io", "tempfile": "python3-io",
    "json": "python3-json",
    "logging": "python3-logging",
    "cmath": "python3-math", "random": "python3-math",
    "mmap": "python3-mmap",
    "multiprocessing": "python3-multiprocessing", "multiprocessing.connection": "python3-multiprocessing",
    "base64": "python3-netclient", "hmac": "python3-netclient", "http.client": "python3-netclient",
    "secrets": "python3-netclient", "urllib.request": "python3-netclient", "uuid": "python3-netclient",
    "socketserver": "python3-netserver",
    "contextvars": "python3-numbers", "decimal": "python3-numbers", "fractions": "python3-numbers",
    "numbers": "python3-numbers",
    "pickle": "python3-pickle",
    "pprint": "python3-pprint",
    "resource": "python3-resource",
    "shlex": "python3-shell",
    "sqlite3": "python3-sqlite3",
    "statistics": "python3-statistics",
    "string": "python3-stringold",
    "queue": "python3-threading",
    "getpass": "python3-unixadmin",
    "zoneinfo": "python3-zoneinfo",
}
# Packages whose modules are looked up by their dotted name (a submodule may live in another package).
_DOTTED = ("concurrent", "http", "importlib", "multiprocessing", "urllib")


def _var(text: str, name: str) -> str | None:
    m = re.search(rf'^{re.escape(name)}\s*=\s*"([^"]*)"', text, re.M)
    return m.group(1) if m else None


def recipe_rdepends(text: str) -> set[str]:
    """The package names in RDEPENDS:${PN} (=, += and .= assignments; no version constraints in this layer)."""
    text = re.sub(r"\\\n", " ", text)
    names: set[str] = set()
    for m in re.finditer(r'^RDEPENDS:\$\{PN\}\s*(?:\+|\.)?=\s*"([^"]*)"', text, re.M):
        names.update(re.sub(r"\([^)]*\)", " ", m.group(1)).split())
    return names


def python_recipes() -> dict[Path, tuple[str, str]]:
    """recipe -> (distribution, version) for the recipes that package a Python distribution."""
    out = {}
    for recipe in RECIPES:
        name, _, version = recipe.stem.partition("_")
        text = recipe.read_text()
        if name == "sits2026":
            out[recipe] = ("sits2026", version)
        elif name.startswith("python3-"):
            dist = _var(text, "SITS_WHEEL_PROJECT") or _var(text, "PYPI_PACKAGE") or name.removeprefix("python3-")
            out[recipe] = (dist, version)
    return out


def _image_environments() -> list[dict[str, str]]:
    return [{"python_version": py, "python_full_version": f"{py}.0", "implementation_version": f"{py}.0",
             "platform_machine": machine, "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
             "implementation_name": "cpython", "platform_python_implementation": "CPython",
             "platform_release": "", "platform_version": "", "extra": ""}
            for py in IMAGE_PYTHONS for machine in IMAGE_MACHINES]


def required_on_image(requires: list[str] | None) -> list[Requirement]:
    """The Requires-Dist entries that apply on some image target (no extra)."""
    envs = _image_environments()
    out = []
    for line in requires or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate(env) for env in envs):
            out.append(req)
    return out


def package_for(name: str) -> str:
    canonical = canonicalize_name(name)
    return PACKAGE_NAMES.get(canonical, f"python3-{canonical}")


def missing_rdepends(dist: str, requires: list[str] | None, rdepends: set[str]) -> list[str]:
    """What the recipe of `dist` should depend on and does not, one line each."""
    missing = []
    for req in required_on_image(requires):
        if (canonicalize_name(dist), canonicalize_name(req.name)) in NOT_NEEDED:
            continue
        pkg = package_for(req.name)
        if pkg not in rdepends:
            missing.append(f"Requires-Dist {req} -> {pkg} is not in RDEPENDS:${{PN}}")
    return missing




@pytest.mark.parametrize("recipe", list(python_recipes()), ids=lambda r: r.name)
def test_rdepends_cover_the_installed_wheels_requires_dist(recipe):
    dist, version = python_recipes()[recipe]
    try:
        installed = md.distribution(dist)
    except md.PackageNotFoundError:
        pytest.fail(f"{recipe.name}: {dist} is not installed here; the check reads its metadata (pip install -e .)")
    assert installed.version == version, (f"{recipe.name} packages {dist} {version}, this environment has "
                                          f"{installed.version}: the metadata compared would be another release's")
    missing = missing_rdepends(dist, installed.requires, recipe_rdepends(recipe.read_text()))
    assert not missing, f"{recipe.name} ({dist} {version}):\n" + "\n".join(missing)


def test_the_image_pythons_come_from_the_wheel_recipes():
    assert IMAGE_PYTHONS and all(re.fullmatch(r"3\.1[2-9]", v) for v in IMAGE_PYTHONS), IMAGE_PYTHONS


def test_the_check_finds_a_dependency_the_recipe_lacks():
    """asyncua's recipe without python3-anyio (as it was) fails; markers and extras that do not apply are ignored."""
    recipe = next(r for r, (d, _) in python_recipes().items() if d == "asyncua")
    rdepends = recipe_rdepends(recipe.read_text())
    assert "python3-anyio" in rdepends
    missing = missing_rdepends("asyncua", md.requires("asyncua"), rdepends - {"python3-anyio"})
    assert len(missing) == 1 and "anyio -> python3-anyio" in missing[0], missing
    reqs = ["wait-for2; python_version < '3.12'", "pytest-profiling; extra == 'profile'", "pywin32; os_name == 'nt'",
            "mclbn256; platform_machine == 'x86_64'", "zoneinfo-shim; python_version >= '3.14'",
            "tzdata; platform_system == 'Windows'", "python-dateutil", "z3-solver>=4"]
    assert [r.name for r in required_on_image(reqs)] == ["mclbn256", "zoneinfo-shim", "python-dateutil", "z3-solver"]
    assert missing_rdepends("x", reqs, set()) == [
        "Requires-Dist mclbn256; platform_machine == \"x86_64\" -> python3-mclbn256 is not in RDEPENDS:${PN}",
        "Requires-Dist zoneinfo-shim; python_version >= \"3.14\" -> python3-zoneinfo-shim is not in RDEPENDS:${PN}",
        "Requires-Dist python-dateutil -> python3-dateutil is not in RDEPENDS:${PN}",
        "Requires-Dist z3-solver>=4 -> python3-z3 is not in RDEPENDS:${PN}"]


def test_every_exception_names_a_real_requirement():
    """A stale NOT_NEEDED row (the wheel dropped the requirement, or the recipe now depends on it) fails."""
    recipes = {canonicalize_name(d): r for r, (d, _) in python_recipes().items()}
    for (dist, req), reason in NOT_NEEDED.items():
        names = {canonicalize_name(r.name) for r in required_on_image(md.requires(dist))}
        assert req in names, f"NOT_NEEDED[{dist}, {req}]: {dist} no longer requires {req}"
        assert package_for(req) not in recipe_rdepends(recipes[dist].read_text()), (
            f"NOT_NEEDED[{dist}, {req}]: the recipe depends on {package_for(req)} after all")
        assert reason


def _top_level_modules(dist: str) -> set[str]:
    return {m for m, dists in md.packages_distributions().items()
            if canonicalize_name(dist) in {canonicalize_name(d) for d in dists}}


@pytest.mark.parametrize("dist", sorted({d for d, _ in NOT_NEEDED if d in IMPORTED_AS}))
def test_what_is_left_out_is_not_loaded(dist):
    left_out = {req for d, req in NOT_NEEDED if d == dist}
    modules = set().union(*(_top_level_modules(r) for r in left_out))
    assert modules, f"none of {left_out} is installed here: cannot check that {dist} does without them"
    code = f"import sys\n{IMPORTED_AS[dist]}\nprint(sorted({{m.split('.')[0] for m in sys.modules}}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = set(ast.literal_eval(r.stdout.strip().splitlines()[-1]))
    assert not loaded & modules, f"{IMPORTED_AS[dist]} loads {sorted(loaded & modules)} ({left_out}): add the RDEPENDS"


def test_the_zk_backends_do_without_mclbn256():
    """sits2026 leaves mclbn256 out: with it unimportable, the backends are gmpy2 and int, and a proof setup's
    verifying key is written (py_ecc) as on aarch64."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "mclbn256":
            raise ImportError("mclbn256 blocked: as on an image without it")
sys.meta_path.insert(0, Block())
from attestation.zk import backend
print(backend.available())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "['int', 'gmpy2']"


def _stdlib_imports() -> dict[str, set[str]]:
    """Standard-library modules imported by the sits2026 sources -> the files importing them."""
    found: dict[str, set[str]] = {}
    for pkg in SOURCE_PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names or top in sys.builtin_module_names:
                        continue
                    key = ".".join(name.split(".")[:2]) if top in _DOTTED and "." in name else top
                    found.setdefault(key, set()).add(str(path.relative_to(REPO)))
    return found


def test_sits2026_declares_the_standard_library_packages_it_imports():
    recipe = next(r for r, (d, _) in python_recipes().items() if d == "sits2026")
    rdepends = recipe_rdepends(recipe.read_text())
    problems = []
    for module, users in sorted(_stdlib_imports().items()):
        pkg = STDLIB_PACKAGE.get(module) or STDLIB_PACKAGE.get(module.split(".")[0])
        if pkg is None:
            problems.append(f"{module} (imported by {', '.join(sorted(users)[:3])}) is not in STDLIB_PACKAGE: look it "
                            "up in openembedded-core's python3-manifest.json and add it")
        elif pkg != "core" and pkg not in rdepends:
            problems.append(f"{module} is in {pkg}, which {recipe.name} does not RDEPEND on "
                            f"(imported by {', '.join(sorted(users)[:3])})")
    assert not problems, "\n".join(problems)


def test_the_standard_library_check_sees_multiprocessing():
    """sitsd/hotswap.py imports multiprocessing.connection at module level: python3-multiprocessing, not core."""
    imports = _stdlib_imports()
    assert "sitsd/hotswap.py" in imports["multiprocessing.connection"]
    assert STDLIB_PACKAGE["multiprocessing.connection"] == "python3-multiprocessing"
