SUMMARY = "Open Neural Network Exchange (ONNX) model format for Python"
DESCRIPTION = "The ONNX protobuf schema, checker, shape inference, helpers and reference evaluator; \
               sitsctl compile and sitsctl check read and rewrite ONNX graphs with it. Building it from \
               source needs protobuf and nanobind with CMake; this recipe installs the abi3 wheel \
               published on PyPI for the target architecture (x86_64 and aarch64, CPython >= 3.12)."
HOMEPAGE = "https://onnx.ai/"
BUGTRACKER = "https://github.com/onnx/onnx/issues"
SECTION = "devel/python"
# NOTICE: the wheel's extension links abseil and protobuf (Apache-2.0) and nanobind (BSD-3-Clause).
LICENSE = "Apache-2.0 & BSD-3-Clause"
LIC_FILES_CHKSUM = "file://LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57 \
                    file://NOTICE;md5=4ff11f1e6d7b8ac1e0aceec4e51c957b"
CVE_PRODUCT = "linuxfoundation:onnx"

inherit sits_prebuilt_wheel

# One stable-ABI wheel (cp312-abi3) per architecture serves every CPython >= 3.12.
SITS_WHEEL_PYTHONS = "3.12 3.13 3.14"
SITS_WHEEL_PYTAG = "cp312"
SITS_WHEEL_ABITAG = "abi3"
SITS_WHEEL_PLATFORM:x86-64 = "manylinux_2_27_x86_64.manylinux_2_28_x86_64"
SITS_WHEEL_PLATFORM:aarch64 = "manylinux_2_26_aarch64.manylinux_2_28_aarch64"
SITS_WHEEL_LICENSE_FILES = "onnx-${PV}.dist-info/licenses/LICENSE onnx-${PV}.dist-info/licenses/NOTICE"

SRC_URI[x86-64-cp312.sha256sum] = "7abf381d278f31ac62487fddedc9dd42da842dce94d5d43536836ee3efdf4a2b"
SRC_URI[aarch64-cp312.sha256sum] = "a203efdbaabbbe8f25e854e2b2921382d6fcf4c67895656f939044b0632974e8"

# What "import onnx" (and onnx.reference, onnx.external_data_helper) load: numpy, protobuf
# (>= 6.31.1), typing-extensions and ml-dtypes, plus uuid (netclient), numbers, tarfile
# (compression, pulled in by python3-core) and importlib.metadata, which reads METADATA with email.
RDEPENDS:${PN} = "python3-email python3-ml-dtypes python3-netclient python3-numbers python3-numpy \
                  python3-protobuf python3-typing-extensions"
# The upstream wheel ships its extension module already stripped (no .symtab); there is nothing for
# the QA check to fix, so it is skipped for this package only.
# nooelint: oelint.vars.insaneskip
INSANE_SKIP:${PN} = "already-stripped"
