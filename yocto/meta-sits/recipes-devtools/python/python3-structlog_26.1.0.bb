SUMMARY = "Structured logging for Python"
DESCRIPTION = "Structured logging; sitsd writes its logs as JSON lines through it."
HOMEPAGE = "https://www.structlog.org/"
BUGTRACKER = "https://github.com/hynek/structlog/issues"
SECTION = "devel/python"
LICENSE = "Apache-2.0 | MIT"
LIC_FILES_CHKSUM = "file://LICENSE-APACHE;md5=2ee41112a44fe7014dce33e26468ba93 \
                    file://LICENSE-MIT;md5=0473cdcf9c6ed3f81c08d886870daea5"
CVE_PRODUCT = "structlog"

inherit pypi python_hatchling

SRC_URI[sha256sum] = "f63a716cbd1b1291cf7661de7794b455acfa4c43c5bcf1630e6ad5ddc1adb3b7"

DEPENDS += "python3-hatch-fancy-pypi-readme-native python3-hatch-vcs-native"
RDEPENDS:${PN} = "python3-json python3-logging"

BBCLASSEXTEND = "native nativesdk"
