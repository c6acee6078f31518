SUMMARY = "Everything an edge box needs to run sitsd"
DESCRIPTION = "sitsd with the TPM 2.0 software stack and tools it uses on the device."
BUGTRACKER = "https://sits2026.invalid/issues"
SECTION = "base"
LICENSE = "MIT"

inherit packagegroup

RDEPENDS:${PN} = "\
    linuxptp \
    sits2026 \
    tpm2-tools \
    tpm2-tss \
"
