"""Signing that keeps the GIL: the control loop's Ed25519 / ES256 signature through the system's libcrypto.

`cryptography` (50.x) releases the GIL for every `sign` call (~35 µs). On the loop thread that is one GIL
hand-off per frame in the middle of the frame: any other Python thread that is runnable then (a hot swap
preparing, the asyncio thread writing to the PLC) takes the GIL, and the loop waits for it back, up to a
switch interval plus the time the kernel takes to wake it (measured on the 2-core box: 1.6-2.1 ms per call
next to a spinning Python thread, against 36 µs alone; docs/hotswap.md). A 35 µs signature is shorter than a
hand-off, so the loop keeps the GIL: the same OpenSSL operations are called through `ctypes.PyDLL`, which
does not release it.

The key is copied into libcrypto once (raw Ed25519 bytes, or the P-256 key as unencrypted PKCS#8 DER; the
bytearray copy of the DER is zeroed after, the immutable bytes objects `cryptography` hands out are left to
the garbage collector, like the key `cryptography` itself holds), and every new key is checked at load: a signature over a
fixed message must verify under the `cryptography` public key (Ed25519 is deterministic, so the bytes must be
equal too). Where libcrypto is missing or the check fails, `load` returns None with the reason and the caller
keeps signing through `cryptography` (correct, only slower next to other threads).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

NID_ED25519 = 1087  # EVP_PKEY_ED25519 in OpenSSL 1.1.1 and 3.x
LIBCRYPTO_NAMES = ("libcrypto.so.3", "libcrypto.so.1.1")
ENV_DISABLE = "SITS_SIGN_RELEASES_GIL"  # "1": sign through cryptography (for comparisons and diagnosis)
_CHECK_MESSAGE = b"sits2026 fastsign self-check"

_lib = None
_lib_error = ""
_lib_lock = threading.Lock()


def _load_library():
    """(PyDLL handle, "") or (None, why)."""
    global _lib, _lib_error
    with _lib_lock:
        if _lib is not None or _lib_error:
            return _lib, _lib_error
        names = list(LIBCRYPTO_NAMES)
        found = ctypes.util.find_library("crypto")
        if found and found not in names:
            names.append(found)
        errors = []
        for name in names:
            try:
                lib = ctypes.PyDLL(name)  # PyDLL: calls keep the GIL (the point of this module)
            except OSError as exc:
                errors.append(f"{name}: {exc}")
                continue
            try:
                _declare(lib)
            except AttributeError as exc:  # an OpenSSL without EVP_DigestSign (< 1.1.1)
                errors.append(f"{name}: {exc}")
                continue
            _lib = lib
            return _lib, ""
        _lib_error = "libcrypto not found (" + "; ".join(errors) + ")"
        return None, _lib_error


def _declare(lib) -> None:
    p, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    sigs = {
        "EVP_PKEY_new_raw_private_key": (p, [i, p, ctypes.c_char_p, sz]),
        "d2i_AutoPrivateKey": (p, [p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_long]),
        "EVP_PKEY_free": (None, [p]),
        "EVP_MD_CTX_new": (p, []),
        "EVP_MD_CTX_free": (None, [p]),
        "EVP_DigestSignInit": (i, [p, p, p, p, p]),
        "EVP_DigestSign": (i, [p, ctypes.c_char_p, ctypes.POINTER(sz), ctypes.c_char_p, sz]),
        "EVP_sha256": (p, []),
        "ERR_get_error": (ctypes.c_ulong, []),
        "ERR_error_string_n": (None, [ctypes.c_ulong, ctypes.c_char_p, sz]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def _openssl_error(lib, what: str) -> str:
    code = lib.ERR_get_error()
    if not code:
        return f"{what} failed"
    buf = ctypes.create_string_buffer(256)
    lib.ERR_error_string_n(code, buf, len(buf))
    while lib.ERR_get_error():  # the rest of the queue: this failure's, not the next call's
        pass
    return f"{what} failed: {buf.value.decode(errors='replace')}"


class SignError(RuntimeError):
    """libcrypto refused a signature (a signer turns it into its own error; nothing unsigned leaves)."""


class HeldGilKey:
    """A private key in libcrypto; `sign(data)` keeps the GIL. Ed25519 gives the 64-byte signature, P-256
    the DER ECDSA signature over SHA-256 (as `cryptography` does)."""

    def __init__(self, lib, pkey: int, kind: str) -> None:
        self._lib, self._pkey, self.kind = lib, pkey, kind
        self._md = lib.EVP_sha256() if kind == "p256" else None
        self._max = 64 if kind == "ed25519" else 80
        self._buf = ctypes.create_string_buffer(self._max)
        self._len = ctypes.c_size_t()
        self._lock = threading.Lock()  # close() from another thread never frees the key under a signature

    def sign(self, data: bytes) -> bytes:
        with self._lock:
            return self._sign(data)

    def _sign(self, data: bytes) -> bytes:
        lib, pkey = self._lib, self._pkey
        if not pkey:
            raise SignError("the key is closed")
        ctx = lib.EVP_MD_CTX_new()
        if not ctx:
            raise SignError(_openssl_error(lib, "EVP_MD_CTX_new"))
        try:
            if lib.EVP_DigestSignInit(ctx, None, self._md, None, pkey) != 1:
                raise SignError(_openssl_error(lib, "EVP_DigestSignInit"))
            self._len.value = self._max
            if lib.EVP_DigestSign(ctx, self._buf, ctypes.byref(self._len), data, len(data)) != 1:
                raise SignError(_openssl_error(lib, "EVP_DigestSign"))
            return self._buf.raw[:self._len.value]
        finally:
            lib.EVP_MD_CTX_free(ctx)

    def close(self) -> None:
        with self._lock:
            pkey, self._pkey = self._pkey, None
            if pkey:
                self._lib.EVP_PKEY_free(pkey)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


def load(key) -> tuple[HeldGilKey | None, str]:
    """(HeldGilKey, "") for an Ed25519 or P-256 `cryptography` private key, or (None, why not): the caller then
    signs through `cryptography`."""
    if os.environ.get(ENV_DISABLE) == "1":
        return None, f"{ENV_DISABLE}=1 in the environment"
    lib, why = _load_library()
    if lib is None:
        return None, why
    if isinstance(key, ed25519.Ed25519PrivateKey):
        raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
        pkey = lib.EVP_PKEY_new_raw_private_key(NID_ED25519, None, raw, len(raw))
        kind = "ed25519"
        what = "EVP_PKEY_new_raw_private_key"
    elif isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        der = bytearray(key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
        buf = (ctypes.c_char * len(der)).from_buffer(der)
        pp = ctypes.c_char_p(ctypes.addressof(buf))
        pkey = lib.d2i_AutoPrivateKey(None, ctypes.byref(pp), len(der))
        del pp, buf
        der[:] = bytes(len(der))  # the Python copy of the key; libcrypto keeps its own
        kind = "p256"
        what = "d2i_AutoPrivateKey"
    else:
        what = key.curve.name if isinstance(key, ec.EllipticCurvePrivateKey) else type(key).__name__
        return None, f"no libcrypto path for {what} keys (Ed25519 and P-256 only)"
    if not pkey:
        return None, _openssl_error(lib, what)
    held = HeldGilKey(lib, pkey, kind)
    try:
        sig = held.sign(_CHECK_MESSAGE)
        if kind == "ed25519":
            key.public_key().verify(sig, _CHECK_MESSAGE)
            if sig != key.sign(_CHECK_MESSAGE):
                raise ValueError("the Ed25519 signature differs from cryptography's")
        else:
            key.public_key().verify(sig, _CHECK_MESSAGE, ec.ECDSA(hashes.SHA256()))
    except Exception as exc:  # InvalidSignature, SignError: this libcrypto does not sign as expected
        held.close()
        return None, f"libcrypto's signature failed the self-check ({exc!r})"
    return held, ""
