"""The live display of `brorl run`: on a terminal a panel redrawn in place (`rich`), in a log one line per
completed step (each step once, nothing while the job waits)."""

from __future__ import annotations

import sys
from typing import TextIO


def step_line(r: dict, steps: int) -> str:
    """One completed step, as a log line."""
    return (f"[brorl run] step {r['step']:>4}/{steps}  reward {r.get('rollout_reward', 0):.3f}  kept "
            f"{r.get('pass_rate', 0):.2f}  loss {r.get('loss', 0):+.4f}  stale {r.get('staleness_mean', 0):.2f}  "
            f"{r.get('samples_per_s', 0):.0f} samples/s")


def status_lines(rows: list[dict], steps: int, restarts: int, heldout: list[dict]) -> list[str]:
    """The panel's text: the last step's line, then progress, rewards, throughput, time split and actors."""
    r = rows[-1]
    recent = rows[-10:]

    def avg(k):
        return sum(x.get(k) or 0 for x in recent) / len(recent)

    done = r["step"] / max(steps, 1)
    busy = avg("wait_s") + avg("train_s") + avg("broadcast_s") or 1.0
    eta = (steps - r["step"]) * busy
    held = " ".join(f"{h['step']}:{100 * h['pass_at_1']:.0f}%" if "pass_at_1" in h else f"{h['step']}:error"
                    for h in heldout[-6:]) or "off (run.eval_interval)"  # an estimate that could not be made
    if heldout and len(heldout[-1].get("by_source") or {}) > 1:
        held += "  (" + ", ".join(f"{s} {100 * p:.0f}%" for s, p in heldout[-1]["by_source"].items()) + ")"
    if heldout and heldout[-1].get("left_out"):
        held += f"  {heldout[-1]['left_out']} prompts left out (too long)"
    hist = " ".join(f"{k.split('_')[1]}:{int(v)}" for k, v in r.items()
                    if k.startswith("staleness_") and k.split("_")[1].isdigit())
    return [
        step_line(r, steps),
        f"  progress   {100 * done:5.1f}%  ~{eta:.0f} s left",
        f"  rollouts   reward {avg('rollout_reward'):.3f}  accuracy {avg('rollout_accuracy'):.3f}  kept by dynamic "
        f"sampling {avg('pass_rate'):.2f}  (last 10 steps)",
        f"  held-out   pass@1 by step: {held}",
        f"  update     TIS mean {r.get('tis_mean', 0):.3f}  clip {r.get('tis_clip_frac', 0):.3f}  mismatch KL "
        f"{r.get('mismatch_kl', 0):.2e}  grad-norm {r.get('grad_norm', 0):.3f}  lr {r.get('lr', 0):.2e}",
        f"  throughput {avg('samples_per_s'):.0f} samples/s  {avg('tokens_per_s'):.0f} tokens/s  time: waiting "
        f"{100 * avg('wait_s') / busy:.0f}%  training {100 * avg('train_s') / busy:.0f}%  broadcasting "
        f"{100 * avg('broadcast_s') / busy:.0f}%",
        f"  actors     version {r.get('version', 0)}  staleness {hist or '-'}  idle for weights "
        f"{r.get('actor_idle_s', 0):.0f} s  engine restarts {int(r.get('actor_engine_restarts', 0))}  "
        f"process restarts {restarts}",
        *source_lines(r),
    ]


def source_lines(r: dict) -> list[str]:
    """The step's rollouts per data source (the `<metric>/<source>` columns), when there are several or code."""
    names = sorted(k.split("/", 1)[1] for k in r if k.startswith("rollout_reward/"))
    if len(names) < 2 and not any(k.startswith("programs_run/") for k in r):
        return []
    out = []
    for n in names:
        line = (f"  {n[:24]:<24} reward {r.get(f'rollout_reward/{n}', 0):.3f}  accuracy "
                f"{r.get(f'rollout_accuracy/{n}', 0):.3f}  kept {r.get(f'kept/{n}', 0):.2f}  truncated "
                f"{r.get(f'truncated/{n}', 0):.2f}")
        if f"programs_run/{n}" in r:
            line += (f"  programs run {r[f'programs_run/{n}']:.0f} passed {r.get(f'programs_passed/{n}', 0):.0f} "
                     f"timed out {r.get(f'programs_timed_out/{n}', 0):.0f}")
        out.append(line)
    return out


class Display:
    """`update` with the metrics rows so far: on a terminal (`live`) a `rich` panel with a progress bar,
    redrawn in place; otherwise the line of every step completed since the last call, each step once."""

    def __init__(self, steps: int, out: TextIO | None = None, live: bool | None = None):
        self.steps, self.out = steps, out or sys.stdout
        self.live = self.out.isatty() if live is None else live
        self.printed = 0  # the last step printed (log mode)
        self.waiting_said = False
        self._live = None

    def update(self, rows: list[dict], restarts: int, heldout: list[dict]) -> None:
        if not rows:
            if not self.waiting_said:
                self.waiting_said = True
                print("[brorl run] waiting for the first step (engines start in ~20-60 s)...", file=self.out, flush=True)
            return
        if not self.live:
            for r in rows:
                if r["step"] > self.printed:
                    print(step_line(r, self.steps), file=self.out, flush=True)
                    self.printed = r["step"]
            return
        panel = self._panel(rows, restarts, heldout)
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(panel, console=Console(file=self.out, force_terminal=True), auto_refresh=False)
            self._live.start()
        self._live.update(panel, refresh=True)

    def _panel(self, rows, restarts, heldout):
        from rich.console import Group
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.text import Text

        lines = status_lines(rows, self.steps, restarts, heldout)
        bar = ProgressBar(total=max(self.steps, 1), completed=rows[-1]["step"], width=40)
        return Panel(Group(Text(lines[0].removeprefix("[brorl run] ")), bar, *map(Text, lines[1:])),
                     title="brorl run", title_align="left")

    def say(self, text: str) -> None:
        """One line of news (a role's event): printed; on a terminal above the panel, which stays below it."""
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.out, flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
