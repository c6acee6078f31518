SUMMARY = "asyncio.wait_for that does not lose results on cancellation"
DESCRIPTION = "A drop-in asyncio.wait_for that returns or cleans up the result of an awaitable that completes while it is being cancelled; needed by asyncua."
HOMEPAGE = "https://github.com/Traktormaster/wait-for2"
BUGTRACKER = "https://github.com/Traktormaster/wait-for2/issues"
SECTION = "devel/python"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=2ee41112a44fe7014dce33e26468ba93"
CVE_PRODUCT = "wait-for2"

PYPI_PACKAGE = "wait_for2"
inherit pypi python_setuptools_build_meta

SRC_URI[sha256sum] = "7f415415d21845c441391d6b4abe68f5959d2c0fbe927c2f61be28a297bc2acb"

BBCLASSEXTEND = "native nativesdk"
