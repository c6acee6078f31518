"""iden3 binary files (.r1cs, .wtns, .zkey, .ptau) and snarkjs JSON (proof, public, vk)."""
