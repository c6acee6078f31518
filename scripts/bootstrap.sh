#!/usr/bin/env bash
# Installs what sits2026 needs on Debian 12, skipping whatever is already there:
# Debian packages (as root; libssl3: attestation.fastsign signs through its libcrypto), then .venv with the project and the extras named in $EXTRAS.
# A second run only checks and returns within seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRAS="${EXTRAS:-test}"
APT_PACKAGES=(swtpm swtpm-tools tpm2-tools libtss2-dev libsystemd-dev pkg-config gcc python3-dev python3-venv iproute2 systemd linuxptp graphviz libssl3)

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
    if [ "$(id -u)" != 0 ]; then
        echo "bootstrap: missing Debian packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "bootstrap: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
stamp=".venv/.installed-${EXTRAS//,/-}"
if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv"
    "$PY" -m venv .venv
fi
# setup.py and sitsd/_native.c: the C extension (sitsd._native), built in place by the editable install
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] || [ sitsd/_native.c -nt "$stamp" ] \
        || ! ls sitsd/_native.*.so >/dev/null 2>&1; then
    echo "bootstrap: installing sits2026[$EXTRAS] into .venv (first run takes about a minute)"
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
    touch "$stamp"
fi

# snarkjs (test and benchmark tool only: the independent Groth16 verifier), pinned in package-lock.json
if [ -f package-lock.json ] && { [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; }; then
    echo "bootstrap: installing npm test tools (snarkjs) into node_modules"
    npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi
