SUMMARY = "Edge image running sitsd under systemd"
DESCRIPTION = "A read-only systemd image with sitsd, tpm2-tss and tpm2-tools. Set DISTRO_FEATURES systemd and tpm2 in the distro configuration."
BUGTRACKER = "https://sits2026.invalid/issues"
SECTION = "images"
LICENSE = "MIT"
CVE_PRODUCT = ""

inherit core-image

IMAGE_FEATURES += "read-only-rootfs"
IMAGE_INSTALL += "packagegroup-sits"

