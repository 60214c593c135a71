"""The `[run]` section: the run folder, seeds, evaluation, metrics sinks and the launcher's supervision."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from config.section import Section


class RunConfig(Section):
    run_dir: str = "runs/default"
    """Folder for checkpoints, metrics and plots."""

    seed: int = 0
    """Master seed."""

    reproducible: bool = False
    """Two runs of one command give the same steps, metrics and held-out curve, bit for bit (tested on CPU):
    every request samples from its own seed (`run.seed`, prompt id), prompts are handed out in waves whose
    size depends only on what the run has seen, a batch is the B lowest-numbered kept groups once every
    granted prompt is answered, and the learner's ops are deterministic. Needs one actor and
    `job.max_staleness = 0`; costs the overlap of generation and training. Several actors, K >= 1 or GPU
    kernels make runs differ (arrival order, batch composition, atomics): docs/configuration.md."""

    eval_prompts: int = Field(64, ge=1)
    """Held-out prompts used for pass@1 before and after training."""

    eval_samples: int = Field(16, ge=1)
    """k samples per prompt for pass@1 (paper: 16, temperature 0.6, top_p 0.95)."""

    max_actor_restarts: int = Field(20, ge=0)
    """`brorl run` restarts an actor process that dies, with a back-off (1 s doubling to 60 s; reset after 10
    minutes of life), at most this many times per actor; past that the actor stays down and is reported."""

    max_learner_restarts: int = Field(3, ge=0)
    """`brorl run` (and `--cluster`) restarts a learner that dies — killed by a signal (SIGKILL, the OOM killer)
    or failing after it started serving — from its last checkpoint, at most this many times in a row (reset
    after 10 minutes of life); 0: never (resume by hand with `--resume`). A learner that fails before it
    serves (a config, data or checkpoint error) or exits with status 78 is never restarted."""

    learner_restart_backoff_s: float = Field(1.0, ge=0.0)
    """Seconds before the first restart of a dead learner, doubling with each restart in a row (at most 60 s);
    the new learner also waits (up to 60 s) for the old one's ports to be free."""

    log_max_mb: float = Field(50.0, gt=0.0)
    """`brorl run` rotates a role's log (`logs/<role>.log` -> `.log.1`, one old copy) when it has grown past
    this size, checked every few seconds."""

    ray_learner_resources: dict[str, float] = Field(default_factory=dict)
    """`brorl run --cluster`: Ray custom resources the learner's Ray actor asks for besides its CPU and GPUs,
    to put it on chosen nodes: `{learner_node = 1}` with `ray start --resources '{"learner_node": 1}'` on
    them. Empty: Ray places it wherever its CPU and GPUs fit."""

    ray_actor_resources: dict[str, float] = Field(default_factory=dict)
    """The same for each actor's Ray actor (`{actor_node = 1}`: an actor per unit on the nodes offering it)."""

    wandb_project: str = ""
    """Also log every step's metrics to Weights & Biases under this project ("": off). The run folder holds
    W&B's files (`wandb/`); `wandb_mode` decides whether they are uploaded."""

    wandb_mode: Literal["offline", "online"] = "offline"
    """"offline": W&B writes its files in the run folder only (upload them later with `wandb sync`);
    "online": it uploads as the job runs (needs `wandb login` and a network)."""

    eval_interval: int = Field(0, ge=0)
    """Every this many steps (and before the first), the learner estimates held-out pass@1 itself with
    transformers (k = `eval_samples`, temperature 0.6, top_p 0.95) into `heldout.jsonl` and the metrics
    (`heldout_pass_at_1`). 0 = off; meant for small models (it pauses training while it runs)."""


    @field_validator("ray_learner_resources", "ray_actor_resources")
    @classmethod
    def _positive_amounts(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: a for k, a in v.items() if not k or a <= 0}
        if bad:
            raise ValueError(f"Ray resources need a name and an amount > 0: {bad}")
        return v
