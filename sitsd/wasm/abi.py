"""The module ABI in numbers (wasm_modules/ABI.md is the prose): one linear memory, fixed offsets."""
from __future__ import annotations

ABI_VERSION = 1
HEADER = 0x000  # i32 abi, i32 n_in, i32 n_out, i32 reset
H_ABI, H_N_IN, H_N_OUT, H_RESET = 0x000, 0x004, 0x008, 0x00C
PARAMS = 0x100  # 256 f64, the module's parameter block
INPUT = 0x900  # 64 f64 written by the host before `process`
OUTPUT = 0xB00  # 64 f64 read by the host after `process`
STATE = 0x1000  # module-private from here to the end of memory
MAX_VALUES = 64
PAGE = 65536
