"""brorl next to the trainer a one-GPU user picks today: TRL's `GRPOTrainer` with vLLM colocated on the same
card, at the same job — model shape, N, prompts a step, fixed prompt and completion lengths, optimizer steps.

    python -m bench.peers --peer trl   --shape qwen2-1.5b --n 16 --prompts-per-step 32 --prompt-len 512 \\
        --completion-len 256 --steps 4 --tag h200
    python -m bench.peers --peer brorl --shape qwen2-1.5b --n 16 --prompts-per-step 32 --prompt-len 512 \\
        --completion-len 256 --steps 4 --tag h200          # `brorl run`, learner and actor sharing GPU 0
    python -m bench.peers --table --tag h200               # print the table of what the file holds
    python -m bench.peers --peer trl --shape small --no-vllm --n 4 --prompts-per-step 2 --prompt-len 32 \\
        --completion-len 16 --steps 2 --tag cpu            # CPU: the plumbing, TRL generating with transformers

Both peers get the same job:
- model: `tinymodel.shaped` (random weights of the shape, its whole vocabulary), built once as bench.e2e builds it;
- prompts: the `throughput` task's (digits and operators, `--prompt-len` characters = tokens under the shaped
  model's one-character tokenizer); reward: its verifiable rule at pass rate 0.5 (a hash of the completion
  under the prompt's rate, `verifiers/throughput.py`);
- every completion `--completion-len` tokens: TRL's vLLM gets `min_tokens` = `max_tokens` and `ignore_eos`
  (`generation_kwargs`, passed to `SamplingParams`); brorl has `actor.length_dist = "fixed"` and no EOS
  override, so a completion stops early only when the random model samples EOS (1 in 151,936 a token; the
  measured mean length is in the results);
- every step trains on N × prompts-per-step samples in one optimizer step: TRL's default (one generation per
  optimizer step, `num_iterations` 1, no reference model); brorl with `learner.dynamic_sampling = false` (no
  group dropped) and `learner.num_minibatches = 1`, plain torch (`learner.backend`), its preset otherwise
  (activation checkpointing on, as TRL's default; updates one step stale at most, generation overlapping
  training: brorl's design, where TRL generates, then trains);
- bf16 (TRL: `bf16=True`, the model's bf16 weights; brorl: its preset), one GPU (TRL: vLLM colocated in the
  trainer's process at `vllm_gpu_memory_utilization`; brorl: bench.e2e's `--share-gpu` settings).
Everything else is each trainer's default (TRL: gradient checkpointing on, AdamW, `--micro-batch` sequences a
micro-batch; `--trl-set KEY=VALUE` changes a `GRPOConfig` field).

Measured: seconds per optimizer step (TRL: a trainer callback at each step's end; brorl: the learner's
wait + train + broadcast per step), samples/s = samples trained a step / mean seconds a step over the steps
after the first `--warmup` (the first holds the first optimizer-state allocation and, for brorl, the engine's
first wait), the generation's share of a TRL step, and the GPU's peak memory in use (nvidia-smi, every
process on the card, sampled each second; TRL's torch peak besides). Each run replaces its row (peer, N) in
bench/results/peers[_<tag>].json and redraws the .png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, GpuMemory, peak_rss_mb, table, write_json

ROOT = Path(__file__).resolve().parents[1]
PASS_RATE = 0.5
COLS = ["peer", "n", "prompts_per_step", "samples_per_step", "prompt_len", "completion_len", "mean_completion_len",
        "steps", "warmup", "s_per_step", "samples_per_s", "tokens_per_s", "gen_share", "peak_gpu_gib", "status"]


def steady(step_s: list[float], warmup: int, samples_per_step: int) -> dict:
    """Seconds a step and samples/s over the steps after the first `warmup`; a clear error when none is left."""
    if len(step_s) <= warmup:
        raise ValueError(f"{len(step_s)} steps timed, none after the {warmup} warm-up step(s): raise --steps "
                         f"above --warmup")
    kept = step_s[warmup:]
    s = sum(kept) / len(kept)
    return {"s_per_step": s, "samples_per_s": samples_per_step / s, "measured_steps": len(kept)}


def prompts(count: int, prompt_len: int, seed: int) -> list[dict]:
    """`count` throughput-task prompts of `prompt_len` characters, each with its reference (a pass rate)."""
    import itertools

    from verifiers import throughput

    return [{"prompt": t.prompt, "reference": t.reference}
            for t in itertools.islice(throughput.generate(seed, PASS_RATE, prompt_len), count)]


def reward(completions: list[str], reference: list[str], **_) -> list[float]:
    """The throughput task's verifiable rule, as TRL calls a reward function (dataset columns as keywords)."""
    from verifiers import throughput

    return [throughput.score(c, r).reward for c, r in zip(completions, reference)]


def run_trl(a, progress=lambda fields: None) -> dict:
    """TRL's GRPOTrainer on the job; vLLM colocated unless --no-vllm. Returns the result row; `progress` gets
    the step times after each step (a run cut short still leaves them)."""
    import torch

    cuda = torch.cuda.is_available()
    if a.vllm and a.torchrun_env:  # what `torchrun --nproc-per-node 1` would set (TRL sets them itself otherwise)
        for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost"}.items():
            os.environ.setdefault(k, v)
        if "MASTER_PORT" not in os.environ:
            from transport.ports import free_ports

            os.environ["MASTER_PORT"] = str(free_ports(1))
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.e2e import model_dir

    samples = a.n * a.prompts_per_step
    if samples % a.micro_batch:
        raise SystemExit(f"--micro-batch {a.micro_batch} must divide N × prompts per step ({samples})")
    model = model_dir(a.shape)
    data = Dataset.from_list(prompts(a.prompts_per_step * a.steps, a.prompt_len, a.seed))
    L = a.completion_len
    gen_kwargs = {"min_tokens": L, "ignore_eos": True} if a.vllm else {"min_new_tokens": L}
    cfg = dict(output_dir=tempfile.mkdtemp(prefix="peers-trl-"), num_generations=a.n,
               per_device_train_batch_size=a.micro_batch, gradient_accumulation_steps=samples // a.micro_batch,
               max_completion_length=L, max_steps=a.steps, logging_steps=1, save_strategy="no", report_to="none",
               bf16=cuda, use_cpu=not cuda, seed=a.seed, use_vllm=a.vllm, vllm_mode="colocate",
               vllm_gpu_memory_utilization=a.vllm_memory, vllm_max_model_length=a.prompt_len + L,
               generation_kwargs=gen_kwargs, **a.trl_set)
    args = GRPOConfig(**cfg)
    lengths: list[int] = []

    def timed_reward(completions, reference, completion_ids, **kw):
        lengths.extend(len(c) for c in completion_ids)
        return reward(completions, reference)

    timed_reward.__name__ = "throughput"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = {"gen": 0.0, "sync": 0.0}

    def timing(fn, key):
        def wrapped(*args, **kw):
            sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                sync()
                clock[key] += time.perf_counter() - t0
        return wrapped

    class StepClock(TrainerCallback):
        def __init__(self):
            self.t, self.step_s, self.gen_s, self.sync_s = None, [], [], []

        def on_train_begin(self, args, state, control, **kw):
            sync()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            t = time.perf_counter()
            self.step_s.append(t - self.t)
            self.gen_s.append(clock["gen"])
            self.sync_s.append(clock["sync"])
            clock["gen"] = clock["sync"] = 0.0
            self.t = t
            print(f"trl step {state.global_step}: {self.step_s[-1]:.2f} s, generation {self.gen_s[-1]:.2f} s",
                  file=sys.stderr, flush=True)
            progress({"s_per_step_all": self.step_s, "gen_s_per_step": self.gen_s,
                      "status": f"cut short after step {len(self.step_s)} of {a.steps}"})

    steps = StepClock()
    t_init = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=timed_reward, args=args, train_dataset=data, callbacks=[steps])
    init_s = time.perf_counter() - t_init
    trainer._generate_single_turn = timing(trainer._generate_single_turn, "gen")  # weight sync + generation
    if a.vllm:
        trainer.vllm_generation.sync_weights = timing(trainer.vllm_generation.sync_weights, "sync")
    trainer.train()
    row = {"s_per_step_all": steps.step_s, "gen_s_per_step": steps.gen_s, "sync_s_per_step": steps.sync_s,
           "init_s": init_s, "completion_len_min": min(lengths), "completion_len_max": max(lengths),
           "mean_completion_len": sum(lengths) / len(lengths),
           "trl_config": {k: v for k, v in cfg.items() if k != "output_dir"},
           # TRL's own per-step logs (num_tokens: prompt + completion tokens so far, its step_time, rewards)
           "trl_logs": trainer.state.log_history,
           "defaults": {k: getattr(args, k) for k in ("learning_rate", "gradient_checkpointing", "loss_type", "beta",
                                                      "num_iterations", "generation_batch_size",
                                                      "steps_per_generation", "vllm_importance_sampling_correction")}}
    if cuda:
        row["torch_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row["torch_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    st = steady(steps.step_s, a.warmup, samples)
    gen = steps.gen_s[a.warmup:]
    return {**row, **st, "gen_share": sum(gen) / (st["s_per_step"] * len(gen))}


def brorl_job(a) -> tuple[str, dict]:
    """(preset, overrides) of `brorl run` at the job: bench.e2e's, with fixed lengths, no group dropped."""
    from bench import e2e

    preset, over = e2e.job(a.shape, 1, a.steps, e2e.model_dir(a.shape), n=a.n, samples=a.n * a.prompts_per_step)
    over.update({"verifiers.task": f"throughput:{PASS_RATE}:{a.prompt_len}", "actor.length_dist": "fixed",
                 "actor.max_tokens": a.completion_len, "actor.length_median": 0,
                 "actor.max_model_len": a.prompt_len + a.completion_len, "learner.dynamic_sampling": False,
                 "job.prompts_per_step": a.prompts_per_step, "actor.prompts_per_request": a.prompts_per_step,
                 # one optimizer step a step as TRL's default; plain torch on the one GPU (no ZeRO), as TRL
                 "learner.num_minibatches": 1, "learner.backend": "torch", "run.seed": a.seed})
    if a.shape == "small":
        over = {k: v for k, v in over.items() if k not in ("learner.gpus", "actor.gpus", "learner.devices", "learner.device")}
    else:
        over.update(e2e.SHARE_GPU)
    over.update(a.brorl_set)
    return preset, over


def run_brorl(a) -> dict:
    from bench.common import brorl_run
    from learner.metrics import loop_seconds

    preset, over = brorl_job(a)
    res = brorl_run(ROOT / "runs" / "bench" / "peers" / f"brorl-n{a.n}", over, preset=preset)
    m = res["metrics"]
    step_s = [loop_seconds([r]) for r in m]
    samples = a.n * a.prompts_per_step
    st = steady(step_s, a.warmup, samples)
    gen = sum(r["generated"] for r in m[a.warmup:])
    return {"s_per_step_all": step_s, **st, "wall_s": res["wall_s"],
            "generated_per_s": gen / sum(step_s[a.warmup:]),
            "mean_completion_len": sum(r.get("tokens", 0.0) for r in m) / max(1.0, sum(r["generated"] for r in m)),
            "brorl_job": {"preset": preset, **{k: v for k, v in over.items() if "port" not in k and k != "model.path"}}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", choices=["trl", "brorl"])
    ap.add_argument("--table", action="store_true", help="print the table of bench/results/peers[_TAG].json and stop")
    ap.add_argument("--shape", default="qwen2-1.5b", help="tinymodel.shaped's shape (small: CPU)")
    ap.add_argument("--n", type=int, default=16, help="N, completions per prompt (TRL's num_generations)")
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=512, help="tokens a prompt")
    ap.add_argument("--completion-len", type=int, default=256, help="tokens every completion")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps")
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out of the steady state")
    ap.add_argument("--micro-batch", type=int, default=8, help="TRL: sequences a micro-batch "
                    "(per_device_train_batch_size; TrainingArguments' default); accumulation makes up the step")
    ap.add_argument("--vllm-memory", type=float, default=0.3, help="TRL: vllm_gpu_memory_utilization")
    ap.add_argument("--no-vllm", dest="vllm", action="store_false", help="TRL: generate with transformers (CPU)")
    ap.add_argument("--torchrun-env", action="store_true", help="TRL: set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR "
                    "and MASTER_PORT before the trainer starts, as a one-process torchrun does (Accelerate then makes a "
                    "one-rank process group); without it TRL sets them for colocated vLLM's one-rank group itself")
    ap.add_argument("--trl-set", action="append", default=[], metavar="KEY=VALUE", help="a GRPOConfig field (VALUE "
                    "as JSON, else text), e.g. --trl-set gradient_checkpointing=false; repeatable")
    ap.add_argument("--brorl-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a brorl config override, as bench.e2e's --set; repeatable")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    from bench.e2e import overrides

    a.trl_set, a.brorl_set = overrides(a.trl_set), overrides(a.brorl_set)
    name = "peers" + (f"_{a.tag}" if a.tag else "")
    if a.table:
        print(table(load(name)["runs"], COLS))
        return
    if a.peer is None:
        ap.error("--peer trl|brorl (or --table)")
    for opt in ("n", "prompts_per_step", "prompt_len", "completion_len", "steps", "micro_batch"):
        if getattr(a, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be at least 1")
    if a.n < 2:
        ap.error("--n must be at least 2 (a group's advantages need two completions)")
    if a.steps <= a.warmup:
        ap.error(f"--steps {a.steps} must exceed --warmup {a.warmup}: no step would be measured")
    samples = a.n * a.prompts_per_step
    row = {"peer": a.peer, "shape": a.shape, "n": a.n, "prompts_per_step": a.prompts_per_step,
           "samples_per_step": samples, "prompt_len": a.prompt_len, "completion_len": a.completion_len,
           "steps": a.steps, "warmup": a.warmup, "command": "python -m bench.peers " + " ".join(sys.argv[1:])}
    if a.peer == "trl":
        row.update(vllm=a.vllm, micro_batch=a.micro_batch, vllm_memory=a.vllm_memory, torchrun_env=a.torchrun_env)
    def progress(fields: dict) -> None:  # the steps so far, in the results file, until the run's own row
        save(name, {**row, **fields, "peak_gpu_gib": mem.peak_gib}, draw=False)

    with GpuMemory(0) as mem:
        try:
            row.update(run_trl(a, progress) if a.peer == "trl" else run_brorl(a), status="ok")
        except Exception as e:  # a peer that fails (out of memory, a limit) is a result: its row says why
            import traceback

            traceback.print_exc()
            row.update(status="failed", error=f"{type(e).__name__}: {str(e)[-2000:]}")
            print(f"{a.peer} failed: {row['error']}", file=sys.stderr)
    row["peak_gpu_gib"] = mem.peak_gib
    row["peak_rss_mib"] = peak_rss_mb()
    if row.get("samples_per_s"):
        row["tokens_per_s"] = row["samples_per_s"] * (a.prompt_len + row.get("mean_completion_len", a.completion_len))
    path = save(name, row)
    print(table([r for r in load(name)["runs"]], COLS))
    print(f"\nwrote {path} and {path.with_suffix('.png')}")
    if row["status"] != "ok":
        raise SystemExit(1)


def load(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {"runs": []}


def save(name: str, row: dict, draw: bool = True) -> Path:
    """Replace the row of the same peer and N (and shape) in `name`.json, keep the others; redraw the figure."""
    key = ("peer", "n", "shape")
    runs = [r for r in load(name)["runs"] if tuple(r.get(k) for k in key) != tuple(row[k] for k in key)]
    runs = sorted([*runs, row], key=lambda r: (r["n"], r["peer"]))
    path = write_json(name, {"runs": runs})
    if draw:
        plot(runs, path.with_suffix(".png"))
    return path


def plot(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import stamp

    ok = [r for r in runs if r.get("status") == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [f"{r['peer']}\nN={r['n']}×{r['prompts_per_step']}" for r in ok]
    axes[0].bar(labels, [r["samples_per_s"] for r in ok], color=["C0" if r["peer"] == "brorl" else "C1" for r in ok])
    axes[0].set_ylabel("samples/s (steps after the warm-up)")
    for r in ok:
        axes[1].plot(range(1, len(r["s_per_step_all"]) + 1), r["s_per_step_all"], "o-", label=f"{r['peer']} N={r['n']}")
    axes[1].set_xlabel("optimizer step")
    axes[1].set_ylabel("seconds")
    axes[1].legend(fontsize=7)
    st = stamp()
    job = f"prompt {runs[0]['prompt_len']} + completion {runs[0]['completion_len']} tokens" if runs else ""
    fig.suptitle(f"brorl and TRL GRPO (vLLM colocated), one {st.get('device', '?')}; {job}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
