SUMMARY = "ONNX Runtime inference engine for Python (CPU build)"
DESCRIPTION = "Microsoft's ONNX Runtime with its CPU execution provider; sitsd runs the control model \
               in it. Building it from source needs its CMake tree with a dozen vendored projects; this \
               recipe installs the wheel published on PyPI for the target architecture and the image's \
               CPython version (x86_64 and aarch64, CPython 3.12 to 3.14)."
HOMEPAGE = "https://onnxruntime.ai/"
BUGTRACKER = "https://github.com/microsoft/onnxruntime/issues"
SECTION = "devel/python"
LICENSE = "MIT"
# ThirdPartyNotices.txt lists the projects compiled into libonnxruntime (their notices ship with it).
LIC_FILES_CHKSUM = "file://LICENSE;md5=0f7e3b1308cb5c00b372a6e78835732d \
                    file://ThirdPartyNotices.txt;md5=0273f4458ab21c4f04b2bf7b9c891f6c"
CVE_PRODUCT = "onnxruntime"

inherit sits_prebuilt_wheel

# One wheel per CPython version (cp3XY-cp3XY) and architecture.
SITS_WHEEL_PYTHONS = "3.12 3.13 3.14"
SITS_WHEEL_PLATFORM:x86-64 = "manylinux_2_28_x86_64"
SITS_WHEEL_PLATFORM:aarch64 = "manylinux_2_28_aarch64"
SITS_WHEEL_LICENSE_FILES = "onnxruntime/LICENSE onnxruntime/ThirdPartyNotices.txt"

SRC_URI[x86-64-cp312.sha256sum] = "99e1074c4b2197accd5073052a465361be17b89c093b8ffb6e6bd8f986c52df8"
SRC_URI[x86-64-cp313.sha256sum] = "02ea12a28c069ea8510093d95a7f6ff8126bfd9fc5c0d3381c03b80fb2b424ba"
SRC_URI[x86-64-cp314.sha256sum] = "48b878f9551d465aa79ee94ecaf49a1f6b5d27f2975efa775ded374db14d0af1"
SRC_URI[aarch64-cp312.sha256sum] = "e36c187006e7a7c8b8d6d57f1a209dd63f52430dca6c282b177718ad6b841054"
SRC_URI[aarch64-cp313.sha256sum] = "54d02baff2df38777b4c3cc7af326406fe8b8a48f54720f4c446d2d327920a79"
SRC_URI[aarch64-cp314.sha256sum] = "4135431395c1f37de0811f452c20a8b774f51812fda6c49611ed9899bbdbeeb4"

# "import onnxruntime" loads numpy and nothing else outside python3-core. The wheel's other
# Requires-Dist (flatbuffers, packaging, protobuf; sympy and ml_dtypes as extras) are imported only
# by onnxruntime.tools, .quantization, .transformers and .backend; the sits2026 recipe adds what its
# one use of them (`sitsctl compile --quantization int8`: .quantization) needs.
RDEPENDS:${PN} = "python3-numpy"
# The bundled libonnxruntime sits in site-packages and is loaded only from Python (sitsd's ep.capi runs the
# control model through its C API, keeping the GIL): keep it
# out of the shared-library provider map so it cannot satisfy (or clash with) a system libonnxruntime.
# PRIVATE_LIBS is package.bbclass's (documented in the reference manual); oelint's list lacks it.
# nooelint: oelint.vars.mispell.unknown
PRIVATE_LIBS = "libonnxruntime.so.1 libonnxruntime_providers_shared.so"
# The upstream wheel ships its shared objects already stripped (no .symtab); there is nothing for
# the QA check to fix, so it is skipped for this package only.
# nooelint: oelint.vars.insaneskip
INSANE_SKIP:${PN} = "already-stripped"
