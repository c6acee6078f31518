# Installs a prebuilt wheel published on PyPI instead of building the project from source.
#
# For projects whose build needs a toolchain the layers we depend on do not have (wasmtime's Rust
# C API, ONNX Runtime's CMake tree with its vendored dependencies). The wheel for the target
# architecture and, for per-interpreter wheels, the image's CPython version is fetched, its license
# files are copied out of it for LIC_FILES_CHKSUM, and python_pep517 installs it as is.
#
# A recipe sets:
#   SITS_WHEEL_PLATFORM:<arch>  platform tag of the wheel for each TARGET_ARCH override it supports
#                               (x86-64, aarch64), e.g. "manylinux_2_28_x86_64"
#   SITS_WHEEL_PYTHONS          CPython versions (PYTHON_BASEVERSION) it has wheels for, e.g.
#                               "3.12 3.13 3.14"; empty for a wheel any Python 3 can load
#   SITS_WHEEL_PYTAG            python tag of the wheel; default cp<version> of the image's Python
#                               (per-interpreter wheels); "py3" or "cp312" (abi3) for shared ones
#   SITS_WHEEL_ABITAG           ABI tag; default the python tag; "none" or "abi3" for shared ones
#   SITS_WHEEL_LICENSE_FILES    paths inside the wheel copied into ${S} (by base name) for
#                               LIC_FILES_CHKSUM
#   SRC_URI[<arch>-<pytag>.sha256sum]  sha256 of each wheel, e.g. SRC_URI[aarch64-cp313.sha256sum]
# and optionally SITS_WHEEL_PROJECT (PyPI project name, default PN without python3-) and
# SITS_WHEEL_DIST (distribution name in the file name, default the project name normalised).
#
# A Python version or architecture without a wheel skips the recipe at parse time with the reason
# (bitbake prints it when something needs the package), so it never reaches a checksum error.

inherit python_pep517

def sits_wheel_dist_name(project):
    """The distribution name as wheel file names spell it (PEP 427 escaping: runs of -_. become _)."""
    import re
    return re.sub(r'[-_.]+', '_', project).lower()

SITS_WHEEL_PROJECT ?= "${@d.getVar('BPN').replace('python3-', '', 1)}"
SITS_WHEEL_DIST ?= "${@sits_wheel_dist_name(d.getVar('SITS_WHEEL_PROJECT'))}"
SITS_WHEEL_PYTHONS ?= ""
SITS_WHEEL_PYVER = "${@d.getVar('PYTHON_BASEVERSION').replace('.', '')}"
SITS_WHEEL_PYTAG ?= "cp${SITS_WHEEL_PYVER}"
SITS_WHEEL_ABITAG ?= "${SITS_WHEEL_PYTAG}"
SITS_WHEEL_PLATFORM ?= ""
SITS_WHEEL_LICENSE_FILES ?= ""
SITS_WHEEL_FILE = "${SITS_WHEEL_DIST}-${PV}-${SITS_WHEEL_PYTAG}-${SITS_WHEEL_ABITAG}-${SITS_WHEEL_PLATFORM}.whl"
# The index's stable layout packages/<python tag>/<initial>/<project>/<file> (PyPI redirects it to
# the file's hashed location); pypi.bbclass uses the same host and layout for sdists. A mirror
# goes through PREMIRRORS/MIRRORS as for any other download, or set SITS_WHEEL_INDEX.
SITS_WHEEL_INDEX ?= "https://files.pythonhosted.org/packages"
SITS_WHEEL_URI = "${SITS_WHEEL_INDEX}/${SITS_WHEEL_PYTAG}/${@d.getVar('SITS_WHEEL_PROJECT')[0]}/${SITS_WHEEL_PROJECT}/${SITS_WHEEL_FILE}"

# pypi.bbclass is not inherited: it prepends the sdist to SRC_URI (SRC_URI:prepend), which would
# be fetched next to the wheel against the wheel's checksum.
SRC_URI = "${SITS_WHEEL_URI};unpack=0;subdir=wheel"
S = "${UNPACKDIR}/wheel"
PEP517_WHEEL_PATH = "${S}"

# manylinux wheels: glibc only (no musl, x32 or ilp32), little-endian x86_64 and aarch64.
COMPATIBLE_HOST ?= "(x86_64|aarch64)(-.*)?-linux$"

# Parse time is the only place a recipe can skip itself with a reason (bb.parse.SkipRecipe), and the
# checksum has to follow PYTHON_BASEVERSION and TARGET_ARCH: both need a few dictionary look-ups here.
# nooelint: oelint.task.noanonpython
python __anonymous() {
    pn = d.getVar('PN')
    pythons = (d.getVar('SITS_WHEEL_PYTHONS') or '').split()
    pyver = d.getVar('PYTHON_BASEVERSION')
    if pythons and pyver not in pythons:
        raise bb.parse.SkipRecipe("%s %s has prebuilt wheels for CPython %s only, this build's Python "
                                  "(PYTHON_BASEVERSION) is %s" % (pn, d.getVar('PV'), ", ".join(pythons), pyver))
    arch = d.getVar('TRANSLATED_TARGET_ARCH')
    if not d.getVar('SITS_WHEEL_PLATFORM'):
        raise bb.parse.SkipRecipe("%s has no prebuilt wheel for %s (SITS_WHEEL_PLATFORM:%s is not set)" % (pn, arch, arch))
    key = "%s-%s" % (arch, d.getVar('SITS_WHEEL_PYTAG'))
    sha256 = d.getVarFlag('SRC_URI', key + '.sha256sum')
    if not sha256:
        raise bb.parse.SkipRecipe("%s: no SRC_URI[%s.sha256sum] for %s" % (pn, key, d.getVar('SITS_WHEEL_FILE')))
    d.setVarFlag('SRC_URI', 'sha256sum', sha256)
}

# The license files sit inside the wheel: copy them out for LIC_FILES_CHKSUM.
do_unpack[postfuncs] += "sits_wheel_extract_licenses"
sits_wheel_extract_licenses[doc] = "Copies SITS_WHEEL_LICENSE_FILES out of the wheel into S for LIC_FILES_CHKSUM"
python sits_wheel_extract_licenses() {
    import os
    import zipfile
    s = d.getVar('S')
    wheel = os.path.join(s, d.getVar('SITS_WHEEL_FILE'))
    with zipfile.ZipFile(wheel) as zf:
        for member in (d.getVar('SITS_WHEEL_LICENSE_FILES') or '').split():
            try:
                data = zf.read(member)
            except KeyError:
                bb.fatal("%s has no %s (SITS_WHEEL_LICENSE_FILES)" % (os.path.basename(wheel), member))
            with open(os.path.join(s, os.path.basename(member)), 'wb') as f:
                f.write(data)
}

do_configure[noexec] = "1"
do_compile[noexec] = "1"
