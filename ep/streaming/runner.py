"""`StreamingRunner`: the streaming model behind the daemon's model interface (`input`, `run()`,
`output`, `sha256`, `path`), one stream per runner: each `run()` is one token (one frame).

Durability: `state_dir` holds the cold file and the frame journal. A runner opened on a directory a
previous one used continues that stream: from the snapshot written by `close()` (a clean stop), or
from the last snapshot plus the journaled frames after it (a crash). Every `checkpoint_every` tokens
the runner checkpoints on the caller's thread (snapshot, fsync, journal truncated), so the journal
and the replay after a crash stay short; 0 checkpoints only at `close()`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ModelLoadError
from .model import StreamSpec
from .pool import PoolConfig, StreamPool


class StreamingRunner:
    kind = "streaming"

    def __init__(self, state_dir: str | Path, n_inputs: int, n_outputs: int, *, stream: int = 0,
                 config: PoolConfig = PoolConfig(hot_slots=1), seed: int = 0, spec: StreamSpec | None = None,
                 checkpoint_every: int = 0, model: bytes | None = None, fp8: bool = False) -> None:
        spec = spec or StreamSpec(n_inputs=n_inputs, n_outputs=n_outputs)
        if (spec.n_inputs, spec.n_outputs) != (n_inputs, n_outputs):
            raise ModelLoadError(f"streaming model: has {spec.n_inputs} inputs and {spec.n_outputs} outputs, "
                                 f"the config declares {n_inputs} and {n_outputs}")
        if checkpoint_every < 0:
            raise ModelLoadError(f"streaming model: checkpoint_every must be >= 0 tokens, not {checkpoint_every}")
        self.pool = StreamPool(state_dir, spec, config, seed, model=model, fp8=fp8)
        self.spec, self.stream = spec, stream
        self.sha256 = self.pool.sha256
        self.manifest = None
        self.ep = self.pool.ep
        # what the loop and the measurement log call this model: no file, the graph is built from the seed
        self.path = Path(self.name_for_seed(seed))
        self.input = self.pool.frame[0]      # [1, n_inputs], written in place by the caller
        self.output = self.pool.action[0]    # [1, n_outputs]
        self.recovered = {"stream": stream, "position": self.position,
                          "replayed_frames": self.pool.recovered.get(stream, 0)}
        self.checkpoint_every = checkpoint_every
        self._until_checkpoint = checkpoint_every
        self._step = self.pool.step
        self._closed: dict | None = None
        self.kv_policy = {"policy": "tiered" if config.archive else "window", "window": config.window,
                          "page_tokens": config.page_tokens, "warm_codec": config.page_format,
                          "warm_pages": config.warm_pages, "cold_slots": config.ring_pages}

    @staticmethod
    def name_for_seed(seed: int) -> str:
        """The name a seed-built model goes by in the loop and the measurement log."""
        return f"streaming-transformer-seed{seed}"

    @classmethod
    def from_artifact(cls, artifact: str | Path, state_dir: str | Path, n_inputs: int, n_outputs: int, *,
                      stream: int = 0, checkpoint_every: int = 0,
                      expected_sha256: str | None = None) -> "StreamingRunner":
        """A streaming artifact of `sitsctl compile --kv-cache-policy window|tiered`: every hash verified,
        the KV settings read from its manifest, `sha256` the artifact SHA-256."""
        from ..artifact import load_artifact

        data, manifest = load_artifact(artifact, expected_sha256)
        kv, shape = manifest.data.get("kv_cache_policy"), manifest.data.get("streaming")
        if not isinstance(kv, dict) or kv.get("policy") not in ("window", "tiered") or not isinstance(shape, dict):
            raise ModelLoadError(f"model {artifact}: not a streaming artifact (its manifest has kv_cache_policy "
                                 f"{kv!r}); compile the streaming model with --kv-cache-policy window or tiered")
        spec = StreamSpec(n_inputs=shape["n_inputs"], n_outputs=shape["n_outputs"], d_model=shape["d_model"],
                          n_heads=shape["d_model"] // shape["head_dim"], kv_heads=shape["kv_heads"],
                          n_layers=shape["n_layers"])
        if (spec.n_inputs, spec.n_outputs) != (n_inputs, n_outputs):
            raise ModelLoadError(f"model {artifact}: has {spec.n_inputs} inputs and {spec.n_outputs} outputs, the "
                                 f"config declares {n_inputs} and {n_outputs}")
        config = PoolConfig(window=kv["window"], page_tokens=kv["page_tokens"], hot_slots=1,
                            warm_pages=kv["warm_pages"], ring_pages=kv["cold_slots"], page_format=kv["warm_codec"],
                            archive=kv["policy"] == "tiered")
        runner = cls(state_dir, n_inputs, n_outputs, stream=stream, config=config, spec=spec,
                     checkpoint_every=checkpoint_every, model=data, fp8=manifest.fp8)
        runner.sha256, runner.manifest, runner.path = bytes.fromhex(manifest.artifact_sha256), manifest, Path(artifact)
        runner.kv_policy = kv
        return runner

    @property
    def position(self) -> int:
        """Tokens this stream has consumed since it began (across restarts)."""
        st = self.pool.streams.get(self.stream)
        return st.position if st is not None else 0

    def run(self) -> np.ndarray:
        """One token on the frame in `self.input`; the result is in `self.output` (also returned)."""
        self._step(self.stream)
        if self.checkpoint_every:
            self._until_checkpoint -= 1
            if not self._until_checkpoint:
                self._until_checkpoint = self.checkpoint_every
                self.pool.checkpoint()
        return self.output

    def describe(self) -> dict:
        """Position and state sizes: KV in RAM is allocated once (hot slot + warm arena), flat in the
        stream's length; the cold file and the journal are on disk. After `close()`, the last state."""
        if self._closed is not None:
            return self._closed
        st = self.pool.streams.get(self.stream)
        return {"stream": self.stream, "position": self.position,
                "window_tokens": st.count if st is not None else 0, "window": self.pool.config.window,
                "page_tokens": self.pool.config.page_tokens, "kv_cache_policy": self.kv_policy,
                "kv_ram_bytes": self.pool.hot.nbytes + self.pool.tiers.slab.nbytes,
                **{f"{k}_bytes": v for k, v in self.pool.state_bytes().items()},
                "recovered": self.recovered, "state_dir": str(self.pool.directory)}

    def close(self) -> None:
        """A clean stop: checkpoint (the next runner resumes from the snapshot), then close the files."""
        if self._closed is not None:
            return
        try:
            self.pool.checkpoint()
        finally:
            self._closed = self.describe()
            self.pool.close()
