"""The one C extension, sitsd._native (sitsd/_native.c, libc only): the wasmtime epoch ticker as a native
thread, so the loop keeps the GIL through module calls while the epoch deadline still interrupts a runaway
module, and a sleep that tells a late kernel wake-up from a GIL wait (bench/hotswap.py). Everything else
about the package is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("sitsd._native", ["sitsd/_native.c"], extra_compile_args=["-O2", "-Wall", "-Wextra"])])
