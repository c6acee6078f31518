SUMMARY = "asyncio bridge to the standard sqlite3 module"
DESCRIPTION = "Runs the standard sqlite3 module on a thread behind an asyncio interface; needed by asyncua."
HOMEPAGE = "https://aiosqlite.omnilib.dev"
BUGTRACKER = "https://github.com/omnilib/aiosqlite/issues"
SECTION = "devel/python"
LICENSE = "MIT"
LIC_FILES_CHKSUM = "file://LICENSE;md5=f0c422eaa1f23d09f8203dc0af3e2d54"
CVE_PRODUCT = "aiosqlite"

inherit pypi python_flit_core

SRC_URI[sha256sum] = "043e0bd78d32888c0a9ca90fc788b38796843360c855a7262a532813133a0650"

RDEPENDS:${PN} = "python3-sqlite3"

BBCLASSEXTEND = "native nativesdk"
