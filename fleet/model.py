"""What the fleet simulator takes and gives: a fleet (`Fleet`: its actors, learner GPUs, N, B, K, lengths,
faults), its component costs (`Rates`, calibrated from our benchmarks by `fleet/calibration.py`) and a run's
outcome (`Result`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass
class Rates:
    """Component costs, measured by our benchmarks (`fleet/calibration.py`)."""
    gen_tokens_per_s: float = 10_000.0
    """One actor engine's decode throughput when saturated, tokens/s."""
    gen_half_seqs: float = 64.0
    """Concurrent sequences at which an engine reaches half of that."""
    score_s_per_group: float = 0.0
    """Scoring one group (N completions), seconds."""
    train_s_per_token: float = 2e-5
    """Learner time per trained token on one GPU (forward, backward, update, π_old)."""
    train_s_fixed: float = 0.05
    """Per step, whatever its size (optimizer, bookkeeping)."""
    scale_efficiency: float = 0.95
    """Learner speed-up kept per doubling of its GPUs (0.95: 1.9× on 2 GPUs)."""
    sync_s_fixed: float = 0.02
    """A weight broadcast's cost whatever the model's size and the members (all of it where
    `sync_s_per_gb` is 0: a calibration measured on one model)."""
    sync_s_per_gb: float = 0.0
    """Added per GB of weights sent (`Fleet.model_gb`): the wire and the packing."""
    sync_s_per_member: float = 0.0
    """Added per member of the weight group."""
    load_s: float = 0.02
    """An actor loading the received weights."""
    contention: float = 0.0
    """Roles sharing a host's cores: while the learner trains and an actor generates, each runs this much
    longer (0.5: 1.5 × as long). 0: each role on devices of its own."""
    train_s_spread: tuple[float, ...] = ()
    """Measured steps' times over what the two numbers above give them, one drawn at random for each step
    (a compiler stall, a slow collective); empty: every step takes its predicted time."""


@dataclass
class Fleet:
    actors: int = 4
    learner_gpus: int = 1
    n: int = 16
    prompts_per_step: int = 8
    prompts_per_request: int = 2
    max_staleness: int = 1
    mean_tokens: float = 256.0
    length_sigma: float = 0.0
    max_tokens: int = 0
    """Cap of a completion (0: none)."""
    lengths: str = "completion"
    """"completion": each completion draws its own length (a real task: a group lasts as long as its longest);
    "prompt": the completions of a prompt share one length (`actor.length_dist`'s budget per prompt, which a
    random-weights model runs to, as in our GPU throughput runs)."""
    keep_rate: float = 0.6
    """Share of the groups dynamic sampling keeps (fixed N)."""
    first_wave: int = 0
    """Adaptive rollouts (`job.rollouts = "adaptive"`, `job.first_wave`): a prompt's first wave; 0: fixed N."""
    settled_first: float = 0.0
    """With `first_wave`: the share of prompts whose first wave all agree; they stop there and are dropped,
    the others get the rest of N in a second wave and are kept (`keep_rate` is not used then)."""
    model_gb: float = 0.0
    """The weights sent at each update, GB (`Rates.sync_s_per_gb`): 3.0 for 1.5B parameters in bf16."""
    in_flight: str = "finish"
    mtbf_s: float = math.inf
    restart_s: float = 30.0
    steps: int = 50
    seed: int = 0
    rates: Rates = field(default_factory=Rates)


@dataclass
class Result:
    samples_per_s: float
    trained_samples_per_s: float
    learner_wait_share: float
    actor_idle_share: float
    staleness_mean: float
    staleness_hist: dict[str, float]
    lag_mean: float
    """Mean learner version − actor version when a group starts (how far behind generation runs)."""
    learner_train_share: float
    """Share of the time the learner trained."""
    learner_sync_share: float
    """Share of the time the learner spent on weight updates (waiting for members to drain, sending)."""
    steps: int
    sim_s: float
    failures: int

    def as_dict(self) -> dict:
        return asdict(self)
