SUMMARY = "sits2026 edge control daemon (sitsd) and its CLI (sitsctl)"
DESCRIPTION = "Closed-loop industrial control with gated inputs, ONNX Runtime inference, \
               sandboxed WASM pre- and post-processing, TPM-signed PLC commands over OPC UA, \
               and a hash-chained audit log."
HOMEPAGE = "https://sits2026.invalid/"
BUGTRACKER = "https://sits2026.invalid/issues"
SECTION = "base"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57"
CVE_PRODUCT = "sits2026"

# python_setuptools_build_meta builds the wheel with the target's compiler: setup.py's one C extension,
# sitsd._native (sitsd/_native.c, libc only: the WASM epoch ticker as a native thread), is compiled for the
# target like any Python extension (setuptools3-base adds python3 to DEPENDS for its headers).
inherit externalsrc python_setuptools_build_meta systemd useradd

# Built from the source tree this layer lives in (externalsrc), so there is nothing to fetch.
# nooelint: oelint.var.mandatoryvar.SRC_URI
SRC_URI = ""

EXTERNALSRC = "${SITS_SOURCE_ROOT}"
EXTERNALSRC_BUILD = "${WORKDIR}/build"

USERADD_PACKAGES = "${PN}"
GROUPADD_PARAM:${PN} = "--system sitsd"
USERADD_PARAM:${PN} = "--system --home-dir ${localstatedir}/lib/sitsd --no-create-home --shell /sbin/nologin --gid sitsd --groups tss sitsd"

# ${PN}-datapart: var-lib-sitsd.mount, the data partition (label sitsdata) on /var/lib/sitsd. A package of
# its own so that an image without that partition (packagegroup-sits in your own image) does not wait for
# it; sits-image installs it and makes the partition (wic/sits-image.wks.in).
PACKAGES =+ "${PN}-datapart"
SYSTEMD_PACKAGES = "${PN} ${PN}-datapart"
SYSTEMD_SERVICE:${PN} = "sitsd.service"
SYSTEMD_SERVICE:${PN}-datapart = "var-lib-sitsd.mount"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"
SYSTEMD_AUTO_ENABLE:${PN}-datapart = "enable"

# The unit runs as User=sitsd Group=sitsd: the config and the approval files are root:sitsd 0640 in
# directories root:sitsd 0750 (as sitsd.tmpfiles says; on a read-only /etc tmpfiles cannot fix them at boot).
# useradd.bbclass adds the group to the recipe sysroot before do_install, so install -g resolves it.
# The config is edited into ${B} first, so the installed file is written once with its final mode and group.
# ${localstatedir}/lib/sitsd is the mount point of the data partition (the daemon's home and state).
do_install:append() {
    install -d ${D}${systemd_system_unitdir} ${D}${nonarch_libdir}/tmpfiles.d ${D}${nonarch_libdir}/sysusers.d
    install -d -m 0750 -g sitsd ${D}${sysconfdir}/sits2026 ${D}${sysconfdir}/sits2026/approval
    install -d -m 0755 ${D}${localstatedir}/lib/sitsd
    install -m 0644 ${S}/systemd/sitsd.service ${S}/systemd/var-lib-sitsd.mount ${D}${systemd_system_unitdir}/
    install -m 0644 ${S}/systemd/sitsd.tmpfiles ${D}${nonarch_libdir}/tmpfiles.d/sitsd.conf
    install -m 0644 ${S}/systemd/sitsd.sysusers ${D}${nonarch_libdir}/sysusers.d/sitsd.conf
    install -d ${D}${datadir}/sits2026/models ${D}${datadir}/sits2026/wasm_modules
    install -m 0644 ${S}/examples/models/rolling_mill.onnx ${D}${datadir}/sits2026/models/rolling_mill.onnx
    install -m 0644 ${S}/wasm_modules/pre_filter.wat ${S}/wasm_modules/pre_filter.golden.json \
        ${S}/wasm_modules/post_command.wat ${S}/wasm_modules/post_command.golden.json \
        ${D}${datadir}/sits2026/wasm_modules/
    install -m 0640 -g sitsd ${S}/examples/approval/rolling-mill.approval.json ${S}/examples/approval/authority.pub.pem \
        ${D}${sysconfdir}/sits2026/approval/
    sed -e 's#artifact: models/rolling_mill.onnx#artifact: ${datadir}/sits2026/models/rolling_mill.onnx#' \
        -e 's#path: ../wasm_modules/#path: ${datadir}/sits2026/wasm_modules/#' \
        ${S}/examples/rolling-mill.yaml > ${B}/sitsd.yaml
    install -m 0640 -g sitsd ${B}/sitsd.yaml ${D}${sysconfdir}/sits2026/sitsd.yaml
}

FILES:${PN} += "${nonarch_libdir}/tmpfiles.d ${nonarch_libdir}/sysusers.d"
CONFFILES:${PN} = "${sysconfdir}/sits2026/sitsd.yaml ${sysconfdir}/sits2026/approval/rolling-mill.approval.json \
                   ${sysconfdir}/sits2026/approval/authority.pub.pem"

# e2fsprogs-e2fsck: var-lib-sitsd.mount has systemd-fsck check the partition before mounting it.
RDEPENDS:${PN}-datapart = "e2fsprogs-e2fsck"

# onnxruntime, onnx, ml-dtypes and py-ecc come from this layer (the first three as prebuilt wheels).
# python3-packaging: sitsctl compile --quantization int8 imports onnxruntime.quantization, which imports packaging.
# python3-py-ecc: the BN254 pairing of the Groth16 verifier where mclbn256 is missing (it is not packaged: every
# aarch64 and x86_64 image), and vk.json's vk_alphabeta_12 when the daemon makes a development proving key.
# The wheel's Requires-Dist are checked against this list by tests/yocto/test_requires_dist.py (mclbn256, an
# optional x86_64 backend, is left out on purpose).
# Among them, CPython's standard library as openembedded-core splits it (python3-manifest.json): python3-asyncio,
# -crypt, -ctypes, -datetime, -email, -io, -json, -logging, -math, -multiprocessing, -netclient, -numbers,
# -statistics, -stringold and -threading each hold a module sitsd, attestation, ep or plc imports (multiprocessing:
# the hot swap's pipe and the prover processes; statistics: imported by sitsd.daemon); the same test checks
# them against the sources.
# libcrypto: attestation.fastsign signs the loop's commands through it with ctypes, keeping the GIL (cryptography's
# own copy of OpenSSL is linked into its extension and releases the GIL for every signature).
RDEPENDS:${PN} = "\
    libcrypto \
    python3-asyncio \
    python3-asyncua \
    python3-cbor2 \
    python3-crypt \
    python3-cryptography \
    python3-ctypes \
    python3-datetime \
    python3-email \
    python3-gmpy2 \
    python3-io \
    python3-json \
    python3-logging \
    python3-math \
    python3-ml-dtypes \
    python3-multiprocessing \
    python3-netclient \
    python3-numbers \
    python3-numpy \
    python3-onnx \
    python3-onnxruntime \
    python3-packaging \
    python3-prometheus-client \
    python3-py-ecc \
    python3-pydantic \
    python3-pyyaml \
    python3-statistics \
    python3-stringold \
    python3-structlog \
    python3-threading \
    python3-tpm2-pytss \
    python3-wasmtime \
    python3-z3 \
    python3-zstandard \
    tpm2-tss \
"
