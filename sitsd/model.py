"""The model the config names (`model.kind`): an `ep.ModelRunner` for an MLP file or artifact, or an
`ep.streaming.StreamingRunner` for the streaming transformer, whose input normalization and tanh
output head are fixed by the config's signal ranges and actuator limits."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ep.errors import ModelLoadError
from ep.session import ModelRunner

from .config import Config, OpcUaSubscriptionTransport

STREAMS_DIR = "streams"


def streaming_spec(cfg: Config):
    """The transformer's shape for this config: inputs scaled from their signal ranges, and a tanh head
    whose range is each output's actuator limits (so the output is bounded for any input and context)."""
    from ep.streaming import StreamSpec

    signals = {s.name: s for s in cfg.signals}
    actuators = {a.output: a for a in cfg.safety.actuators}
    return StreamSpec(n_inputs=len(cfg.model.inputs), n_outputs=len(cfg.model.outputs),
                      input_range=tuple((signals[n].lower, signals[n].upper) for n in cfg.model.inputs),
                      output_range=tuple((actuators[o].min, actuators[o].max) for o in cfg.model.outputs))


def stream_id(cfg: Config) -> int:
    """One stream per publisher: (publisher_id, dataset_writer_id) of a UADP transport, 0 for a subscription."""
    t = cfg.transport
    if isinstance(t, OpcUaSubscriptionTransport):
        return 0
    pid = t.publisher_id
    if isinstance(pid, int) and pid < 1 << 47:
        return (pid << 16) | t.dataset_writer_id  # as before: existing stream state keeps its id
    # a string or a wide (uint64) PublisherId: a stable 63-bit digest of both ids (the pool's id range)
    digest = hashlib.sha256(f"{type(pid).__name__}:{pid}/{t.dataset_writer_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def state_directory(cfg: Config) -> Path:
    return Path(cfg.model.stream.state_directory or Path(cfg.audit.directory) / STREAMS_DIR)


def streaming_graph(cfg: Config) -> bytes:
    """The streaming model's ONNX bytes: the compiled artifact's (verified), or the one built from the seed."""
    if cfg.model.artifact is not None:
        from ep.artifact import resolve_model

        return resolve_model(cfg.model.artifact, cfg.model.sha256)[0]
    from ep.streaming import build_model

    return build_model(streaming_spec(cfg), cfg.model.stream.seed).SerializeToString()


def head_range(cfg: Config, graph: bytes | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """The streaming model's output range as its graph's tanh head guarantees it (float32, for any input
    and any context); None when the graph has no such head (then nothing bounds its outputs)."""
    from ep.streaming import head_range_of

    return head_range_of(graph if graph is not None else streaming_graph(cfg))


def model_sha256(cfg: Config) -> str:
    """The SHA-256 the daemon will sign commands with, without loading a session."""
    if cfg.model.kind == "streaming" and cfg.model.artifact is None:
        from ep.streaming import build_model

        return hashlib.sha256(build_model(streaming_spec(cfg), cfg.model.stream.seed).SerializeToString()).hexdigest()
    from ep.artifact import resolve_model

    return resolve_model(cfg.model.artifact)[1].hex()


def model_event(cfg: Config) -> tuple[str, str]:
    """(name, sha256 hex) of the configured model as the measurement log records it: the artifact's (or
    .onnx file's) name and its verified hash; for a streaming model built from its seed, the runner's name
    `streaming-transformer-seed<N>` and the hash of the built graph. Raises ModelLoadError (ep) for an
    artifact that does not load or verify."""
    if cfg.model.kind == "streaming" and cfg.model.artifact is None:
        from ep.streaming.runner import StreamingRunner

        return StreamingRunner.name_for_seed(cfg.model.stream.seed), model_sha256(cfg)
    from ep.artifact import resolve_model

    return Path(cfg.model.artifact).name, resolve_model(cfg.model.artifact)[1].hex()


def build_model(cfg: Config):
    """The runner the loop calls (`input`, `run()`, `output`, `sha256`, `path`); ModelLoadError says why not."""
    m = cfg.model
    if m.kind == "mlp":  # model.provider: "cpu" (default) or "auto" (ep.providers)
        return ModelRunner(m.artifact, len(m.inputs), len(m.outputs), policy=m.provider)
    from ep.errors import EpError
    from ep.streaming import PoolConfig, StreamingRunner

    s = m.stream
    pool = PoolConfig(window=s.window, page_tokens=s.page_tokens, hot_slots=1, warm_pages=s.warm_pages,
                      ring_pages=s.ring_pages, page_format=s.page_format)
    # the state belongs to one model and one set of KV settings (a manifest's are covered by the artifact's
    # hash): another model or other settings get their own directory and start a fresh stream, never
    # resume KV computed by other weights or laid out for another window
    settings = ("" if m.artifact is not None
                else f"|{s.window}|{s.page_tokens}|{s.warm_pages}|{s.ring_pages}|{s.page_format}")
    key = hashlib.sha256((model_sha256(cfg) + settings).encode()).hexdigest()[:16]
    state = state_directory(cfg) / key
    try:
        if m.artifact is not None:  # KV policy and its parameters from the artifact's manifest
            runner = StreamingRunner.from_artifact(m.artifact, state, len(m.inputs), len(m.outputs),
                                                   stream=stream_id(cfg), checkpoint_every=s.checkpoint_every,
                                                   expected_sha256=m.sha256)
        else:
            runner = StreamingRunner(state, len(m.inputs), len(m.outputs), stream=stream_id(cfg),
                                     config=pool, seed=s.seed, spec=streaming_spec(cfg),
                                     checkpoint_every=s.checkpoint_every)
    except ModelLoadError:
        raise
    except (EpError, OSError) as exc:
        raise ModelLoadError(f"streaming model (state in {state}): {exc}\n  fix: check that "
                             f"model.streaming.state_directory is writable, or move {state} away to start the "
                             f"stream anew") from exc
    _check_head(cfg, runner)
    return runner


def runtime_report(runner) -> dict | None:
    """Where the runner's model runs, from its `ep.Session` (`runner.ep`), for the startup log and
    `sitsctl status`: the policy and the provider it chose (how, on which devices, what the build has),
    ORT's provider list for the session, the placement (nodes per provider, and the nodes left on the CPU EP
    when an accelerator was chosen), and the session's notes (provider, FP8 folding or int8-blocks
    lowering, node counts). None for a runner without an `ep.Session`."""
    s = getattr(runner, "ep", None)
    choice = getattr(s, "choice", None)
    if choice is None:
        return None
    placement = dict(getattr(s, "placement", None) or {})
    from ep.providers import CPU

    return {"policy": choice.policy, "provider": choice.provider, "via": choice.via, "devices": list(choice.devices),
            "available": list(choice.available), "providers": list(s.providers),
            "placement": {p: len(nodes) for p, nodes in placement.items()},
            "cpu_fallback_nodes": list(placement.get(CPU, [])) if choice.provider != CPU else [],
            "notes": list(s.notes)}


def _check_head(cfg: Config, runner) -> None:
    """The safe default: a streaming model starts only if its tanh head bounds every output inside the
    actuator limits (attention itself is not analysed, so the head is the only bound there is)."""
    rng = head_range(cfg, runner.pool.model_bytes)
    by_output = {a.output: a for a in cfg.safety.actuators}
    if rng is None:
        runner.close()
        raise ModelLoadError("streaming model: its graph does not end in the tanh output head (action = "
                             "tanh(z) * out_half + out_mid), so nothing bounds its outputs and sitsd refuses it\n"
                             "  fix: export it with `python -m sitsd.model export-streaming --config CONFIG`, which "
                             "puts the actuator limits into the head")
    for i, o in enumerate(cfg.model.outputs):
        if rng[0][i] < by_output[o].min or rng[1][i] > by_output[o].max:
            runner.close()
            raise ModelLoadError(f"streaming model: output {o} is bounded to [{rng[0][i]:g}, {rng[1][i]:g}] by its "
                                 f"head, not inside the actuator limits [{by_output[o].min:g}, {by_output[o].max:g}]\n"
                                 f"  fix: export the model again for this config's limits")


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .config import load_config

    p = argparse.ArgumentParser(prog="python -m sitsd.model", description="The streaming model of a config, "
                                "as the ONNX file `sitsctl compile --kv-cache-policy window|tiered` takes.")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export-streaming", help="write the streaming transformer this config would build")
    e.add_argument("--config", type=Path, required=True)
    e.add_argument("--output", type=Path, required=True, help="the .onnx file to write")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    if cfg.model.kind != "streaming":
        raise SystemExit(f"{args.config}: model.kind is {cfg.model.kind}, not streaming")
    from ep.streaming import build_model as build_graph

    args.output.write_bytes(build_graph(streaming_spec(cfg), cfg.model.stream.seed).SerializeToString())
    print(f"{args.output}: streaming transformer (seed {cfg.model.stream.seed}), inputs scaled from the signal "
          f"ranges, tanh head inside the actuator limits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
