SUMMARY = "asyncio.wait_for that does not lose results on cancellation"
DESCRIPTION = "A race-free asyncio.wait_for; needed by asyncua."
HOMEPAGE = "https://github.com/Traktormaster/wait-for2"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=2ee41112a44fe7014dce33e26468ba93"

PYPI_PACKAGE = "wait_for2"
inherit pypi python_setuptools_build_meta

SRC_URI[sha256sum] = "7f415415d21845c441391d6b4abe68f5959d2c0fbe927c2f61be28a297bc2acb"
