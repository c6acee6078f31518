SUMMARY = "Pure Python OPC UA client and server library (asyncio)"
DESCRIPTION = "OPC UA client and server on asyncio; sitsd uses its client for command writes."
HOMEPAGE = "https://github.com/FreeOpcUa/opcua-asyncio"
BUGTRACKER = "https://github.com/FreeOpcUa/opcua-asyncio/issues"
SECTION = "devel/python"
LICENSE = "LGPL-3.0-or-later"
LIC_FILES_CHKSUM = "file://COPYING;md5=e6a600fd5e1d9cbde2d983680233ad02"
CVE_PRODUCT = "asyncua"

inherit pypi python_hatchling

SRC_URI[sha256sum] = "d741f5e21f189ac0a45b8dda13539c2d49d8d992b9b62d2758efe1bfd3d1454c"

# The wheel's Requires-Dist (tests/yocto/test_requires_dist.py compares them): anyio is imported when the package
# is (asyncua.crypto.uacrypto); wait-for2 is required only below Python 3.12 (asyncua.common.utils imports it
# lazily there), kept so that a layer carrying an older Python still works.
RDEPENDS:${PN} = "python3-aiosqlite python3-anyio python3-cryptography python3-dateutil python3-pytz \
                  python3-sortedcontainers python3-typing-extensions python3-wait-for2"

BBCLASSEXTEND = "native nativesdk"
