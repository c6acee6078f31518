SUMMARY = "Edge image running sitsd under systemd"
DESCRIPTION = "A read-only systemd image with sitsd, tpm2-tss and tpm2-tools, and a persistent data partition \
               for sitsd's state. Set DISTRO_FEATURES systemd and tpm2 in the distro configuration."
BUGTRACKER = "https://sits2026.invalid/issues"
SECTION = "images"
LICENSE = "MIT"
CVE_PRODUCT = ""

inherit core-image

IMAGE_FEATURES += "read-only-rootfs"
IMAGE_INSTALL += "packagegroup-sits sits2026-datapart"

# The root file system is read-only and volatile-binds puts /var/lib on tmpfs: sitsd's state (audit log,
# deployment.json, active-stages.json, OPC UA PKI) goes to the ext4 partition "sitsdata", made by this
# kickstart and mounted on /var/lib/sitsd by var-lib-sitsd.mount (package sits2026-datapart).
# sits-image.wks.in is an EFI (GPT) layout. For another boot flow, point WKS_FILE:pn-sits-image at your
# BSP's kickstart with the sitsdata line of sits-image.wks.in added, and set SITS_WIC_BOOT_DEPENDS = "".
WKS_FILE = "sits-image.wks.in"
IMAGE_FSTYPES += "wic wic.bmap"
# SITS_* are this layer's own variables (used by sits-image.wks.in); oelint-adv does not know them.
# Fixed size of the data partition (wic --fixed-size): audit.max_total_mb and audit.retention_days must fit in it.
# nooelint: oelint.vars.mispell.unknown
SITS_DATA_SIZE ?= "2048M"
# The EFI loader the boot partition takes from DEPLOY_DIR_IMAGE must be deployed before wic runs.
SITS_WIC_BOOT_DEPENDS ?= "${EFI_PROVIDER}:do_deploy"
# nooelint: oelint.vars.mispell.unknown
do_image_wic[depends] += "${SITS_WIC_BOOT_DEPENDS}"
# oe-core renamed wic's EFI source plugin from bootimg-efi to bootimg_efi (newer releases); use the name the
# oe-core of this build ships.
# nooelint: oelint.vars.mispell.unknown
SITS_WIC_EFI_SOURCE ?= "${@'bootimg_efi' if os.path.exists(os.path.join(d.getVar('COREBASE'), 'scripts/lib/wic/plugins/source/bootimg_efi.py')) else 'bootimg-efi'}"
EFI_PROVIDER ??= "systemd-boot"
