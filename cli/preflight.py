"""`brorl run`'s pre-flight: what would make a role fail after minutes is checked in seconds before any starts.

    cfg = preflight(cfg, cluster=None)   # cluster: `brorl run --cluster`

In order: the job's GPU placement on this host (not for `--cluster`: Ray places it), the data files (each
exists, is readable in a known layout and has a usable row; only the first `ROWS_CHECKED` rows of each are
read here), the model folder (config.json, a tokenizer that loads, weights),
the first rows of every training file rendered with the model's tokenizer (a file none of whose rows
renders is refused with the fix), the procedural task when there are no files, the ports (a taken port is
refused; a port of 0 is replaced by a free one here, so every role is started with the same real ports; the
run folder (writable) is checked before the ports. A failure raises `PreflightError`: one line naming the cause and the fix, and
nothing written. It returns the config the roles run with (ports resolved).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from config.loader import ConfigError

ROWS_CHECKED = 1000  # rows of each data file read by the pre-flight
RENDERED = 64  # rows of each training file rendered with the model's tokenizer
PORTS = ("work_port", "rollout_port", "control_port")


class PreflightError(ConfigError):
    """`brorl run` cannot work as configured; the message is one line: cause, then fix."""


def preflight(cfg, *, cluster: str | None = None):
    if cluster is None:  # Ray places the roles of a cluster job on its nodes' GPUs
        _placement(cfg)
    loaded = _data(cfg)
    tok = _model(cfg)
    if tok is not None:
        _render(cfg, tok, loaded)
    if not cfg.data.train:
        _generator(cfg)
    _run_dir(cfg)
    return _ports(cfg, cluster)  # last: its word on chosen ports is said only for a run that starts


def _fail(msg: str):
    raise PreflightError("pre-flight: " + " ".join(msg.split()))  # one line, whatever the cause's text holds


def _placement(cfg) -> None:
    """This host's GPUs against the job's placement (the launcher places it again as it starts the roles)."""
    from cli.launcher import placed
    from config.loader import ConfigError

    try:
        placed(cfg)
    except ConfigError as e:
        _fail(str(e))


def _sample(src):
    return src.model_copy(update={"limit": min(src.limit or ROWS_CHECKED, ROWS_CHECKED)})


def _data(cfg) -> list:
    """(role, source, its first usable tasks) of every data file."""
    from taskdata import DataError
    from taskdata.sources import load_source, reference_checker

    check, out = reference_checker(), []
    for role, sources in (("train", cfg.data.train), ("eval", cfg.data.eval)):
        for src in sources:
            path = Path(src.path)
            if path.exists() and not os.access(path, os.R_OK):
                _fail(f"data.{role}: {path}: not readable by this user; fix its permissions")
            try:
                out.append((role, src, load_source(_sample(src), cfg.data, role, check=check).tasks[:RENDERED]))
            except DataError as e:
                _fail(f"data.{role}: {e}{_data_fix(str(e))}")
            except Exception as e:  # a reader's own error (a corrupt save_to_disk folder, ...)
                _fail(f"data.{role}: {path}: cannot be read ({type(e).__name__}: {e}); JSONL, a JSON list, Parquet "
                      f"or a save_to_disk folder")
    return out


def _data_fix(msg: str) -> str:
    if "no such file or folder" in msg:
        return " (paths are taken from the working directory, " + os.getcwd() + ")"
    if "holds no rows" in msg or "is empty" in msg:
        return ": give a file with rows"
    return ""


def _model(cfg):
    """The model's tokenizer, or None where `brorl run` builds the tiny model itself (under runs/)."""
    from tinymodel import is_model_dir
    from tinymodel.build import TOKENIZER_FILES

    path = Path(cfg.model.path).expanduser()
    if cfg.model.path.startswith("runs/") and not is_model_dir(path):
        return None  # ensure_model builds it
    fix = "model.path must be a Hugging Face model folder (config.json, the tokenizer's files, *.safetensors)"
    if not path.exists():
        _fail(f"model.path {cfg.model.path!r}: no such folder (brorl never downloads weights); {fix}")
    if not path.is_dir():
        _fail(f"model.path {cfg.model.path!r}: a file, not a folder; {fix}")
    if not (path / "config.json").is_file():
        _fail(f"model.path {cfg.model.path!r}: no config.json; {fix}")
    if cfg.learner.packing:
        _packable(cfg.model.path, path / "config.json")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        _fail(f"model.path {cfg.model.path!r}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json); copy the "
              f"tokenizer's files from the model you trained into the folder")
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        _fail(f"model.path {cfg.model.path!r}: no weights (*.safetensors or pytorch_model*.bin); {fix}")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many kinds for a broken tokenizer
        _fail(f"model.path {cfg.model.path!r}: its tokenizer does not load ({type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}); {fix}")


def _packable(name: str, config_json: Path) -> None:
    """learner.packing: packed attention does not cap attention logits (Gemma 2's softcapping)."""
    try:
        conf = json.loads(config_json.read_text())
    except (OSError, ValueError) as e:
        _fail(f"model.path {name!r}: config.json does not read as JSON ({e})")
    for c in (conf, conf.get("text_config") or {}):
        if c.get("attn_logit_softcapping"):
            _fail(f"learner.packing: the model at {name!r} caps its attention logits (attn_logit_softcapping = "
                  f"{c['attn_logit_softcapping']}), which packed attention does not do; set --learner.packing false")


def _render(cfg, tok, loaded: list) -> None:
    """Every data file must have a row that renders for this model (its first rows are tried)."""
    from taskdata import PromptRenderer, RenderError

    renderer = PromptRenderer(tok, cfg.data, cfg.actor.max_model_len - 1)
    for role, src, tasks in loaded:
        errors = []
        for t in tasks:
            try:
                renderer.render(t)
                break
            except RenderError as e:
                errors.append(str(e))
        else:
            if errors:
                fix = "; raise actor.max_model_len" if "actor.max_model_len leaves" in errors[0] else ""
                _fail(f"data.{role}: {src.path}: none of the first {len(errors)} rows renders for this model: "
                      f"{errors[0]}{fix}")


def _generator(cfg) -> None:
    import itertools

    from taskdata import DatasetError, task_source

    try:
        next(itertools.islice(task_source(cfg.verifiers.task, cfg.run.seed, "train", cfg.verifiers.difficulty), 1))
    except DatasetError as e:
        _fail(f"verifiers.task: {e}")


def _ports(cfg, cluster: str | None):
    """Ports of 0 replaced by free ones on this machine; a taken one refused. With Ray the learner may run on
    another node: its ports cannot be checked or chosen here."""
    from transport.ports import free_port

    t = cfg.transport
    given = {k: getattr(t, k) for k in PORTS}
    zero = [k for k, v in given.items() if v == 0]
    if cluster:
        if zero:
            _fail(f"transport.{zero[0]} = 0 with --cluster: the learner's node is chosen by Ray, so no free port can "
                  f"be picked here; give the port (e.g. --transport.{zero[0]} {5555 + PORTS.index(zero[0])})")
        return cfg
    seen: dict[int, str] = {}
    for k, v in given.items():
        if v and v in seen:
            _fail(f"transport.{seen[v]} and transport.{k} are both {v}: each socket needs its own port")
        if v:
            seen[v] = k
            why = _taken(t.host, v)
            if why:
                _fail(f"transport.{k} = {v}: {why}; stop what holds it, or give another port (0: pick a free one)")
    if not zero:
        return cfg
    chosen = dict(given)
    for k in zero:
        chosen[k] = free_port(t.host, avoid=[p for p in chosen.values() if p])
    print("[brorl run] ports: " + ", ".join(f"transport.{k} = {chosen[k]}" for k in zero) + " (chosen free)",
          flush=True)
    return cfg.model_copy(update={"transport": t.model_copy(update={k: chosen[k] for k in zero})})


def _taken(host: str, port: int) -> str:
    """Why `port` cannot be bound on `host` ("" if it can, or if `host` is not an address of this machine)."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: a port in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use by another process"
            if e.errno == errno.EACCES:
                return f"port {port} needs privileges (ports below 1024)"
            return ""  # not this machine's address (a cluster's head): the learner's bind says
    return ""


def _run_dir(cfg) -> None:
    d = Path(cfg.run.run_dir).expanduser()
    if d.exists() and not d.is_dir():
        _fail(f"run.run_dir {cfg.run.run_dir!r}: a file, not a folder; give another run.run_dir")
    probe = d
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        _fail(f"run.run_dir {cfg.run.run_dir!r}: {probe} is a file, not a folder; give another run.run_dir")
    if not os.access(probe, os.W_OK | os.X_OK):
        _fail(f"run.run_dir {cfg.run.run_dir!r}: {probe} is not writable by this user; give a run.run_dir you can "
              f"write (--run.run_dir runs/mine)")
