SUMMARY = "NumPy dtype extensions for machine learning (bfloat16, float8, int4, ...)"
DESCRIPTION = "bfloat16, the float8/float6/float4 families and narrow integer types as NumPy dtypes; \
               onnx needs it and sitsctl compile uses float8 through it. This recipe installs the wheel \
               published on PyPI for the target architecture and the image's CPython version (x86_64 \
               and aarch64, CPython 3.12 to 3.14)."
HOMEPAGE = "https://github.com/jax-ml/ml_dtypes"
BUGTRACKER = "https://github.com/jax-ml/ml_dtypes/issues"
SECTION = "devel/python"
# ml_dtypes is Apache-2.0; the extension compiles in Eigen headers, which are MPL-2.0 (LICENSE.eigen).
LICENSE = "Apache-2.0 & MPL-2.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57 \
                    file://LICENSE.eigen;md5=f75d2927d3c1ed2414ef72048f5ad640"
CVE_PRODUCT = "ml_dtypes"

inherit sits_prebuilt_wheel

# One wheel per CPython version (cp3XY-cp3XY) and architecture.
SITS_WHEEL_PROJECT = "ml-dtypes"
SITS_WHEEL_PYTHONS = "3.12 3.13 3.14"
SITS_WHEEL_PLATFORM:x86-64 = "manylinux_2_27_x86_64.manylinux_2_28_x86_64"
SITS_WHEEL_PLATFORM:aarch64 = "manylinux_2_27_aarch64.manylinux_2_28_aarch64"
SITS_WHEEL_LICENSE_FILES = "ml_dtypes-${PV}.dist-info/licenses/LICENSE ml_dtypes-${PV}.dist-info/licenses/LICENSE.eigen"

SRC_URI[x86-64-cp312.sha256sum] = "3b4a480aa8fd54a1805b8ac10f3f91763926a74f73c0c364c10f9231854f4170"
SRC_URI[x86-64-cp313.sha256sum] = "26b1f1fa4f0435a2946859823f6e2bf06796f1e9f10f5a05b08a5e3c8f46ff69"
SRC_URI[x86-64-cp314.sha256sum] = "8f490c003369ce60e514a0c3b12374f05274c101fee1bead6740ec8a564032b0"
SRC_URI[aarch64-cp312.sha256sum] = "37da32aa97749251025666d62372775019594577b9c9e9cfda83bed48d778fdb"
SRC_URI[aarch64-cp313.sha256sum] = "28d676428b104bb9717b0928bc5c5129f2d6b51b6727587cc4289e7bf8713cb5"
SRC_URI[aarch64-cp314.sha256sum] = "317be9967fb84b0ce4e80e6b1bf71213d21971621cf6f1e501a63602a95297bf"

# "import ml_dtypes" loads numpy only. The wheel requires numpy >= 2.0 (>= 2.1 on CPython 3.13,
# >= 2.3 on 3.14): see README.md for which releases' python3-numpy satisfies that.
RDEPENDS:${PN} = "python3-numpy"
# The upstream wheel ships its extension module already stripped (no .symtab); there is nothing for
# the QA check to fix, so it is skipped for this package only.
# nooelint: oelint.vars.insaneskip
INSANE_SKIP:${PN} = "already-stripped"
