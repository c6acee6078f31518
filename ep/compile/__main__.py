"""`python -m ep.compile MODEL.onnx --calibration DATA.npy --output DIR` (same as `sitsctl compile`)."""
import sys

from .cli import main

sys.exit(main())
