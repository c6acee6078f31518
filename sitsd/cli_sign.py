"""`sitsctl sign` (on the offline signing host) and `sitsctl verify-signature`: detached signatures of WASM
modules, configs and models by the authority key (attestation.signatures, docs/deploy.md)."""
from __future__ import annotations

import sys
from pathlib import Path


def _sha(path: Path, kind: str) -> str | None:
    """A model artifact directory is signed by its artifact SHA-256, as ep and the TPM name it."""
    if kind == "model":
        from .signatures import model_sha256

        return model_sha256(path)
    return None


def _for_each_file(args, prog: str, load_key, key_path: Path, act, error_status: int, error_prefix) -> int:
    """Load the key once, then run `act(key, path, kind)` on every file; a failing file is reported
    (`error_prefix(path)`) and the others still run. Exit status: 0, `error_status`, or 2 for the key."""
    from attestation.signatures import SignatureError, kind_of
    from attestation.tpm.policy import PolicyError

    try:
        key = load_key(key_path)
    except PolicyError as exc:
        print(f"sitsctl {prog}: {exc}", file=sys.stderr)
        return 2
    status = 0
    for path in args.files:
        try:
            kind = args.kind or kind_of(path)
            print(act(key, path, kind))
        except (SignatureError, OSError) as exc:
            print(f"{error_prefix(path)}{exc}", file=sys.stderr)
            status = error_status
    return status


def _cmd_sign(args) -> int:
    from attestation.signatures import sign, write
    from attestation.tpm.policy import load_authority_private

    def act(key, path, kind) -> str:
        sig = sign(key, path, kind, _sha(path, kind))
        out = write(sig, path)
        return f"signed {kind} {path} sha256 {sig.sha256} by authority {sig.authority_id[:16]}…: {out}"

    return _for_each_file(args, "sign", load_authority_private, args.authority_key, act, 2,
                          lambda _path: "sitsctl sign: ")


def _cmd_verify(args) -> int:
    from attestation.signatures import verify
    from attestation.tpm.policy import load_authority_public

    def act(key, path, kind) -> str:
        sig = verify(key, path, kind, _sha(path, kind))
        return f"OK {kind} {path} sha256 {sig.sha256} signed by authority {sig.authority_id[:16]}…"

    return _for_each_file(args, "verify-signature", load_authority_public, args.authority_pub, act, 1,
                          lambda path: f"INVALID {path}: ")


def register(sub) -> None:
    """Adds `sign` and `verify-signature` to sitsctl's subcommands."""
    kinds = ("module", "config", "model")
    sg = sub.add_parser("sign", help="sign WASM modules, configs or models with the authority key (FILE.sig)",
                        description="Writes FILE.sig next to each FILE: its kind, name and SHA-256 signed with the "
                        "authority's P-256 key (ECDSA). Run it on the offline signing host; sitsd checks the "
                        "signatures when attestation.require_signatures asks for them. See docs/deploy.md.")
    sg.add_argument("--authority-key", type=Path, required=True, help="the authority's private key (PEM)")
    sg.add_argument("--kind", choices=kinds, default=None, help="default: from the suffix (.wat/.wasm module, "
                    ".yaml config, .onnx or a directory model)")
    sg.add_argument("files", nargs="+", type=Path, metavar="FILE")
    sg.set_defaults(func=_cmd_sign)
    vs = sub.add_parser("verify-signature", help="check FILE.sig against FILE and the authority public key "
                        "(exit 0 only if every file verifies)")
    vs.add_argument("--authority-pub", type=Path, required=True, help="the authority's public key (PEM)")
    vs.add_argument("--kind", choices=kinds, default=None, help="default: from the suffix")
    vs.add_argument("files", nargs="+", type=Path, metavar="FILE")
    vs.set_defaults(func=_cmd_verify)
