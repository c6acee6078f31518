"""Groth16 on BN254, snarkjs-compatible: R1CS, model->circuit compiler, setup, prover, verifier.

Public surface; the modules behind it are small and named after what they own (field, curve, msm,
ntt, r1cs, model, quantize, compiler, setup, prover, verifier, formats/*).
"""
from .backend import available as available_backends
from .compiler import CompiledModel, ConditionSpec, ContextSpec, LinearSpec, compile_chain
from .errors import ZkError
from .keys import Proof, ProvingKey, VerifyingKey
from .model import ModelChain, load_onnx, parse_onnx
from .prover import PreparedKey, prepare, prove
from .r1cs import R1CS, Builder, Circuit, Lin
from .setup import ToxicWaste, dev_setup
from .verifier import verify

__all__ = ["available_backends", "CompiledModel", "ConditionSpec", "ContextSpec", "LinearSpec", "compile_chain", "ZkError", "Proof", "ProvingKey",
           "VerifyingKey", "ModelChain", "load_onnx", "parse_onnx", "PreparedKey", "prepare", "prove", "R1CS",
           "Builder", "Circuit", "Lin", "ToxicWaste", "dev_setup", "verify"]
