"""The live display of `brorl run`: a panel redrawn in place on a terminal, its first line in logs."""

from __future__ import annotations


def status_lines(rows: list[dict], steps: int, restarts: int, heldout: list[dict]) -> list[str]:
    """The live display: a summary line, then progress, rewards, throughput, time split and actors."""
    r = rows[-1]
    recent = rows[-10:]

    def avg(k):
        return sum(x.get(k) or 0 for x in recent) / len(recent)

    done = r["step"] / max(steps, 1)
    bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
    busy = avg("wait_s") + avg("train_s") + avg("broadcast_s") or 1.0
    eta = (steps - r["step"]) * busy
    held = " ".join(f"{h['step']}:{100 * h['pass_at_1']:.0f}%" for h in heldout[-6:]) or "off (run.eval_interval)"
    hist = " ".join(f"{k.split('_')[1]}:{int(v)}" for k, v in r.items()
                    if k.startswith("staleness_") and k.split("_")[1].isdigit())
    return [
        f"[brorl run] step {r['step']:>4}/{steps}  reward {r.get('rollout_reward', 0):.3f}  pass-rate "
        f"{r.get('pass_rate', 0):.2f}  loss {r.get('loss', 0):+.4f}  stale {r.get('staleness_mean', 0):.2f}  "
        f"{r.get('samples_per_s', 0):.0f} samples/s",
        f"  progress   [{bar}] {100 * done:5.1f}%  ~{eta:.0f} s left",
        f"  rollouts   reward {avg('rollout_reward'):.3f}  accuracy {avg('rollout_accuracy'):.3f}  dynamic-sampling pass "
        f"rate {avg('pass_rate'):.2f}  (last 10 steps)",
        f"  held-out   pass@1 by step: {held}",
        f"  update     TIS mean {r.get('tis_mean', 0):.3f}  clip {r.get('tis_clip_frac', 0):.3f}  mismatch KL "
        f"{r.get('mismatch_kl', 0):.2e}  grad-norm {r.get('grad_norm', 0):.3f}  lr {r.get('lr', 0):.2e}",
        f"  throughput {avg('samples_per_s'):.0f} samples/s  {avg('tokens_per_s'):.0f} tokens/s  time: waiting "
        f"{100 * avg('wait_s') / busy:.0f}%  training {100 * avg('train_s') / busy:.0f}%  broadcasting "
        f"{100 * avg('broadcast_s') / busy:.0f}%",
        f"  actors     version {r.get('version', 0)}  staleness {hist or '-'}  idle for weights "
        f"{r.get('actor_idle_s', 0):.0f} s  engine restarts {int(r.get('actor_engine_restarts', 0))}  "
        f"process restarts {restarts}",
    ]
