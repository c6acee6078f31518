SUMMARY = "Python bindings for the Wasmtime WebAssembly runtime"
DESCRIPTION = "Wasmtime's Python API with its prebuilt C library (libwasmtime). sitsd runs its \
               sandboxed pre- and post-processing modules in it. Building wasmtime from source needs \
               a Rust toolchain and the wasmtime C API crate; this recipe installs the wheel published \
               for the target architecture instead (x86_64 and aarch64 only)."
HOMEPAGE = "https://pypi.org/project/wasmtime/"
BUGTRACKER = "https://pypi.org/project/wasmtime/"
SECTION = "devel/python"
LICENSE = "Apache-2.0-with-LLVM-exception"
LIC_FILES_CHKSUM = "file://LICENSE;md5=a1ba2b4c4f909ac0b517d8a37d2ac70f"
CVE_PRODUCT = "bytecodealliance:wasmtime"

inherit pypi python_pep517

COMPATIBLE_HOST = "(x86_64|aarch64).*-linux"

WHEEL_PLATFORM = "unknown"
WHEEL_PLATFORM:x86-64 = "manylinux1_x86_64"
WHEEL_PLATFORM:aarch64 = "manylinux2014_aarch64"
WHEEL_FILE = "wasmtime-${PV}-py3-none-${WHEEL_PLATFORM}.whl"

# Wheels live under packages/<python tag>/<initial>/<project>/ on the same index that pypi.bbclass
# fetches sdists from; the base URL is taken from PYPI_SRC_URI so a configured mirror still applies.
PYPI_BASE_URI = "${@d.getVar('PYPI_SRC_URI').split('/packages/')[0]}"
SRC_URI = "${PYPI_BASE_URI}/packages/py3/w/wasmtime/${WHEEL_FILE};unpack=0;subdir=wheel"
SRC_URI[x86-64.sha256sum] = "cc14c3a17654e0394e0225b11813532ef0cd7bd1e222a0c5494cdedaabeddac4"
SRC_URI[aarch64.sha256sum] = "675484e525c028dc02762b777f1db4477ea70caa3fec6775426daff4d64edfb1"
SRC_URI[sha256sum] = "${@d.getVarFlag('SRC_URI', d.getVar('TARGET_ARCH').replace('_', '-') + '.sha256sum')}"

S = "${UNPACKDIR}/wheel"
PEP517_WHEEL_PATH = "${S}"

# The license file sits inside the wheel: take it out for LIC_FILES_CHKSUM.
do_unpack[depends] += "unzip-native:do_populate_sysroot"
do_unpack[postfuncs] += "sits_extract_wheel_license"
sits_extract_wheel_license[doc] = "Copies the license file out of the wheel for LIC_FILES_CHKSUM"
sits_extract_wheel_license() {
    unzip -o -j -q ${S}/${WHEEL_FILE} 'wasmtime-${PV}.dist-info/licenses/LICENSE' -d ${S}
}

do_configure[noexec] = "1"
do_compile[noexec] = "1"

RDEPENDS:${PN} = "python3-ctypes python3-threading"
# libwasmtime.so comes prebuilt and stripped by its upstream build: there is nothing for the
# QA checks to fix here, so they are skipped for this package only.
# nooelint: oelint.vars.insaneskip
INSANE_SKIP:${PN} = "already-stripped ldflags"
