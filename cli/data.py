"""`brorl data preview`: a few rows of each data file as the engine will see them — the rendered prompt and
its token count, the data source and the verifier it goes to, what the verifier reads from the reference —
and what was left out and why, so data is checked before GPUs are rented."""

from __future__ import annotations

import argparse

from cli.common import add_config_arg, load


RENDER_CHECKED = 1000  # rows of each file rendered for token counts and render failures


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("data", help="check data files: brorl data preview --data.train FILE")
    p.add_argument("action", choices=["preview"], help="preview: rows as the model and the verifiers see them")
    add_config_arg(p)
    p.add_argument("--rows", type=int, default=2, help="rows shown per file (default 2)")
    p.add_argument("--chars", type=int, default=600, help="characters of each rendered prompt shown (default 600)")
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from pathlib import Path

    from taskdata import DataError, PromptRenderer, RenderError
    from taskdata.sources import load_all
    from verifiers.registry import Registry

    cfg = load(args, overrides)
    if not cfg.data.train and not cfg.data.eval:
        print("brorl data preview: no data file named (data.train, data.eval): the job uses the generator "
              f"{cfg.verifiers.task!r}")
        return 0
    renderer = None
    if (Path(cfg.model.path) / "config.json").exists():
        renderer = PromptRenderer.for_model(cfg.model.path, cfg.data, cfg.actor.max_model_len - 1)
        how = ("on (the model's own)" if cfg.data.chat_template is True else "on (data.chat_template's)") \
            if renderer.templated else "off (plain text)"
        print(f"model {cfg.model.path}: chat template {how}; "
              f"prompts may take {cfg.actor.max_model_len - 1} tokens (actor.max_model_len - 1)")
    else:
        print(f"model.path {cfg.model.path!r} holds no model here: prompts shown unrendered, without token counts")
    reg, status = Registry(), 0
    for role in ("train", "eval"):
        try:
            loaded = load_all(cfg.data, role)
        except DataError as e:
            print(f"\n[{role}] ERROR: {e}")
            status = 1
            continue
        for lo in loaded:
            c = lo.counts
            lengths, failed = [], []
            checked = lo.tasks[:RENDER_CHECKED] if renderer is not None else []
            for t in checked:
                try:
                    lengths.append(len(renderer.render(t).ids))
                except RenderError as e:
                    failed.append(str(e))
            used, bad = c["used"] - len(failed), c["bad"] + len(failed)
            cut = f" of the first {len(checked)} rendered" if len(lo.tasks) > len(checked) and failed else ""
            print(f"\n[{role}] {lo.source.path}  layout {lo.layout}  rows {c['rows']}: used {used}, bad {bad}"
                  f"{f' ({len(failed)}{cut} cannot be rendered for this model)' if failed else ''}, "
                  f"held out {c['held_out']}, also in data.eval {c['overlap']}")
            by = {}
            for t in lo.tasks:
                by.setdefault((t.source, t.verifier), 0)
                by[(t.source, t.verifier)] += 1
            print("  data source -> verifier: " + ", ".join(f"{s} -> {v} ({n})" for (s, v), n in sorted(by.items())))
            for line in lo.bad[:3]:
                print(f"  left out: {line}")
            if failed:
                print(f"  cannot be rendered: {failed[0]}")
                if len(failed) == len(checked):  # no row of this file renders: the job would refuse it
                    status = 1
            if lengths:
                lengths.sort()
                print(f"  prompt tokens (first {len(checked)} rows): min {lengths[0]}, median "
                      f"{lengths[len(lengths) // 2]}, max {lengths[-1]}; cannot be rendered: {len(failed)}")
            for t in lo.tasks[:args.rows]:
                _show(t, renderer, reg, args.chars)
    return status


def _show(t, renderer, reg, chars: int) -> None:
    from taskdata import RenderError

    print(f"  --- {t.task_id}  data source {t.source!r}  verifier {t.verifier!r}")
    try:
        r = renderer.render(t) if renderer is not None else None
        text, n = (r.text, f"{len(r.ids)} tokens") if r else (t.prompt, "not tokenized")
    except RenderError as e:
        text, n = t.prompt, f"NOT RENDERABLE: {e}"
    cut = text if len(text) <= chars else text[:chars] + f" ... [{len(text) - chars} more characters]"
    print(f"  prompt ({n}):\n" + "\n".join("    | " + line for line in cut.splitlines()))
    describe = reg.get(t.verifier).describe
    ref = describe(t.reference) if describe else (t.reference if len(t.reference) <= 200 else t.reference[:200] + " ...")
    print(f"  reference, as the verifier reads it: {ref}")
