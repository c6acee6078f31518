"""Sound output bounds of ONNX models over an input box: IBP, CROWN linear relaxation, input
splitting to prove output limits, and certificates checked before a model is hot-swapped in."""
from .analysis import Analysis, analyze, crown_bounds, ibp_bounds
from .branch import OpenRegion, ProofResult, Witness, prove
from .certificate import Certificate, Verification, box_sha256, certify, verify_certificate
from .errors import BoundsError, CertificateError
from .graph import load_graph
from .ops import SUPPORTED as SUPPORTED_OPS

__all__ = ["Analysis", "BoundsError", "Certificate", "CertificateError", "OpenRegion", "ProofResult",
           "SUPPORTED_OPS", "Verification", "Witness", "analyze", "box_sha256", "certify", "crown_bounds",
           "ibp_bounds", "load_graph", "prove", "verify_certificate"]
