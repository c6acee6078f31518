"""`StreamingRunner`: the streaming model behind the daemon's model interface (`input`, `run()`,
`output`, `sha256`), one stream per runner: each `run()` is one token (one frame)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ModelLoadError
from .model import StreamSpec
from .pool import PoolConfig, StreamPool


class StreamingRunner:
    """`state_dir` holds the cold file and the frame journal: a restarted daemon continues the stream
    where it stopped (the snapshot + journal replay of `StreamPool`)."""

    def __init__(self, state_dir: str | Path, n_inputs: int, n_outputs: int, *, stream: int = 0,
                 config: PoolConfig = PoolConfig(hot_slots=1), seed: int = 0, spec: StreamSpec | None = None) -> None:
        spec = spec or StreamSpec(n_inputs=n_inputs, n_outputs=n_outputs)
        if (spec.n_inputs, spec.n_outputs) != (n_inputs, n_outputs):
            raise ModelLoadError(f"streaming model: has {spec.n_inputs} inputs and {spec.n_outputs} outputs, "
                                 f"the config declares {n_inputs} and {n_outputs}")
        self.pool = StreamPool(state_dir, spec, config, seed)
        self.stream = stream
        self.sha256 = self.pool.sha256
        self.manifest = None
        self.ep = self.pool.ep
        self.input = self.pool.frame[0]      # [1, n_inputs], written in place by the caller
        self.output = self.pool.action[0]    # [1, n_outputs]
        self._step = self.pool.step

    def run(self) -> np.ndarray:
        """One token on the frame in `self.input`; the result is in `self.output` (also returned)."""
        self._step(self.stream)
        return self.output

    def close(self) -> None:
        self.pool.close()
