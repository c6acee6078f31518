# Two commands: `make demo` and `make test`. Both install what is missing first.
SECONDS_DEMO ?= 20
PYTEST_ARGS ?=

.PHONY: setup demo test bench train-model clean

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/sitsctl demo --seconds $(SECONDS_DEMO)

test: setup
	.venv/bin/python -m pytest $(PYTEST_ARGS)

bench: setup
	.venv/bin/python bench/loop_latency.py --frames 2000
	.venv/bin/python bench/uadp_codec.py
	.venv/bin/python bench/gates.py
	.venv/bin/python bench/signing.py
	.venv/bin/python bench/ep.py
	.venv/bin/python bench/zk.py
	.venv/bin/python bench/hotswap.py
	.venv/bin/python bench/receive_gil.py
	.venv/bin/python bench/rca.py
	.venv/bin/python bench/soak.py --seconds 40

# Reproduces examples/models/rolling_mill.onnx (needs torch 2.13.0, installed by this target).
train-model:
	@EXTRAS=test,train bash scripts/bootstrap.sh
	.venv/bin/python examples/train_demo_model.py --output examples/models/rolling_mill.onnx

clean:
	rm -rf .venv .pytest_cache .hypothesis build *.egg-info sitsd/_native.*.so
