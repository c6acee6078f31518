SUMMARY = "Elliptic curve crypto in Python, including the BN254 (alt_bn128) pairing"
DESCRIPTION = "Pure Python elliptic curve arithmetic and pairings. sits2026 uses its optimized_bn128 \
               module for the Groth16 pairing check where libmcl is missing (aarch64) and to write \
               vk_alphabeta_12 into vk.json when the daemon makes a development proving key."
HOMEPAGE = "https://github.com/ethereum/py_ecc"
BUGTRACKER = "https://github.com/ethereum/py_ecc/issues"
SECTION = "devel/python"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=3799286261cc175242ef1b9ef893a6ab"
CVE_PRODUCT = "py_ecc"

PYPI_PACKAGE = "py_ecc"
inherit pypi python_setuptools_build_meta

SRC_URI[sha256sum] = "56aca19e5dc37294f60c1cc76666c03c2276e7666412b9a559fa0145d099933d"

# "from py_ecc import optimized_bn128" loads the standard library only: py_ecc/__init__.py reads its version with
# importlib.metadata, which parses METADATA with email. The wheel's Requires-Dist eth-typing and eth-utils are
# imported only by py_ecc.bls, which sits2026 does not use; tests/yocto/test_requires_dist.py checks both claims.
RDEPENDS:${PN} = "python3-email"

BBCLASSEXTEND = "native nativesdk"
