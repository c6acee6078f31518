SUMMARY = "Python bindings for the Wasmtime WebAssembly runtime"
DESCRIPTION = "Wasmtime's Python API with its prebuilt C library (libwasmtime). sitsd runs its \
               sandboxed pre- and post-processing modules in it. Building wasmtime from source needs \
               a Rust toolchain and the wasmtime C API crate; this recipe installs the wheel published \
               for the target architecture instead (x86_64 and aarch64 only)."
HOMEPAGE = "https://pypi.org/project/wasmtime/"
BUGTRACKER = "https://github.com/bytecodealliance/wasmtime-py/issues"
SECTION = "devel/python"
LICENSE = "Apache-2.0-with-LLVM-exception"
LIC_FILES_CHKSUM = "file://LICENSE;md5=a1ba2b4c4f909ac0b517d8a37d2ac70f"
CVE_PRODUCT = "bytecodealliance:wasmtime"

inherit sits_prebuilt_wheel

# One wheel per architecture for every Python 3 (py3-none: libwasmtime is loaded through ctypes).
SITS_WHEEL_PYTAG = "py3"
SITS_WHEEL_ABITAG = "none"
SITS_WHEEL_PLATFORM:x86-64 = "manylinux1_x86_64"
SITS_WHEEL_PLATFORM:aarch64 = "manylinux2014_aarch64"
SITS_WHEEL_LICENSE_FILES = "wasmtime-${PV}.dist-info/licenses/LICENSE"

SRC_URI[x86-64-py3.sha256sum] = "cc14c3a17654e0394e0225b11813532ef0cd7bd1e222a0c5494cdedaabeddac4"
SRC_URI[aarch64-py3.sha256sum] = "675484e525c028dc02762b777f1db4477ea70caa3fec6775426daff4d64edfb1"

RDEPENDS:${PN} = "python3-ctypes python3-threading"
