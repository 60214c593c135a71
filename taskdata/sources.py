"""The user's files as task lists: each source read, its rows checked, split and mixed.

A row is checked when it is loaded: its layout's fields (`layouts.to_task`), its verifier (registered?), and
the reference against the verifier's own rule where the verifier has one (`check_reference`: code tests that
any silent program passes, unknown IFEval instructions, ...). A bad row is named — file, row, field, reason —
and skipped (counted) or fatal (`data.on_bad_row`); a source left with no usable row is an error.

Splits: with `data.eval` the training files are used whole, less any row whose prompt is also an eval
prompt (counted as `overlap`); without it a share of the training rows (`data.heldout_share`, default 0.1)
is held out by a hash of the prompt, the same on every run. A brorl-layout row's own `split` field wins.
Mixing: every training source is shuffled (seeded, a new order each pass) and the stream draws a source
per prompt by `weight`, so a resumed run sees the same prompt at the same position.
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Literal

from config.data import DataConfig, DataSource
from taskdata.files import DataError, columns, rows
from taskdata.generators import split_of
from taskdata.layouts import BadRow, detect, fields_of, to_task
from verifiers.base import Task

log = logging.getLogger("brorl.data")
Role = Literal["train", "eval", "heldout"]
DEFAULT_HELDOUT_SHARE = 0.1


@dataclass
class Loaded:
    """One source as read: its tasks and what was wrong with the rest."""

    source: DataSource
    layout: str
    tasks: list[Task] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    """"file:row: field: reason" for every row left out."""
    counts: dict[str, int] = field(default_factory=dict)
    """rows, used, bad, held_out (the other split), overlap (also an eval prompt)."""


def reference_checker() -> Callable[[str, str], str]:
    """(verifier name, reference) -> "" or why the verifier refuses the reference. Built-in verifiers are
    imported here (trusted code); one without a `check_reference` accepts every reference."""
    from verifiers.registry import Registry

    reg, cache = Registry(), {}

    def check(name: str, reference: str) -> str:
        if name not in cache:
            try:
                cache[name] = reg.get(name).check_reference
            except Exception as e:  # an unknown name (KeyError), or a verifier that does not import
                cache[name] = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        fn = cache[name]
        if isinstance(fn, str):
            return f"verifier {name!r}: {fn}"
        return fn(reference) if fn is not None else ""

    return check


def load_source(src: DataSource, cfg: DataConfig, role: Role, *, exclude: set[str] | None = None,
                check: Callable[[str, str], str] | None = None) -> Loaded:
    """Read one source for `role` ("train": its training rows; "eval": every row; "heldout": the held-out
    share of a training file)."""
    path = Path(src.path)
    default_split = "train" if role != "eval" else "test"
    layout = src.layout if src.layout != "auto" else _detect(src, default_split)
    f = fields_of(layout, src.prompt_key, src.answer_key, src.source_key)
    check = check or reference_checker()
    share = cfg.heldout_share or (DEFAULT_HELDOUT_SHARE if not cfg.eval else 0.0)
    out = Loaded(src, layout, counts=dict(rows=0, used=0, bad=0, held_out=0, overlap=0))
    for i, row in rows(src, default_split):
        out.counts["rows"] += 1
        where = f"{path}:{i}"
        try:
            if isinstance(row, str):
                raise BadRow(row)
            t = to_task(row, f, task_id=f"{path.name}:{i}", default_source=path.stem, verifier=src.verifier,
                        user_map=cfg.verifier_map)
            why = check(t.verifier, t.reference)
            if why:
                raise BadRow(f"reference: {why}")
        except BadRow as e:
            out.counts["bad"] += 1
            msg = f"{where}: {e}"
            if cfg.on_bad_row == "fatal":
                raise DataError(f"{msg} (data.on_bad_row = \"fatal\")") from None
            out.bad.append(msg)
            continue
        if role != "eval":
            own = row.get("split") if layout == "brorl" else None
            split = own if own in ("train", "eval") else split_of(t.prompt, share)
            if (split == "eval") != (role == "heldout"):
                out.counts["held_out"] += 1
                continue
        if exclude and t.prompt in exclude:
            out.counts["overlap"] += 1
            continue
        out.counts["used"] += 1
        out.tasks.append(t)
    if not out.counts["rows"]:
        raise DataError(f"{path}: holds no rows")
    if not out.tasks and role != "heldout":  # said once, in the error (no warning before it)
        c = out.counts
        first = f"; the first bad row: {out.bad[0]}" if out.bad else ""
        raise DataError(f"{path}: no usable {role} row ({c['rows']} rows: {c['bad']} bad, {c['held_out']} held out, "
                        f"{c['overlap']} also in data.eval){first}")
    if out.bad:
        log.warning("%s: %d of %d rows left out; the first: %s", path, len(out.bad), out.counts["rows"], out.bad[0])
    return out


def _detect(src: DataSource, default_split: str) -> str:
    cols = columns(src, default_split)
    if not cols and next(rows(src, default_split), None) is None:
        raise DataError(f"{src.path}: holds no rows")
    try:
        return detect(cols)
    except BadRow as e:
        raise DataError(f"{src.path}: {e}") from None


def load_all(cfg: DataConfig, role: Role) -> list[Loaded]:
    """Every source of a role: "train" and "heldout" read `data.train`, "eval" reads `data.eval`."""
    check = reference_checker()
    if role == "eval":
        return [load_source(s, cfg, "eval", check=check) for s in cfg.eval]
    exclude = {t.prompt for lo in load_all(cfg, "eval") for t in lo.tasks} if cfg.eval and role == "train" else None
    return [load_source(s, cfg, role, exclude=exclude, check=check) for s in cfg.train]


def mixture(parts: list[tuple[list[Task], float]], seed: int) -> Iterator[Task]:
    """An endless stream: each draw picks a part by weight, then that part's next task (each part reshuffled,
    seeded, at every pass). Deterministic for a seed."""
    parts = [(tasks, w) for tasks, w in parts if tasks]
    if not parts:
        raise DataError("no training task in any source")
    pick = random.Random(seed)
    weights = [w for _, w in parts]
    streams = [_passes(tasks, seed, k) for k, (tasks, _) in enumerate(parts)]
    while True:
        k = pick.choices(range(len(parts)), weights)[0] if len(parts) > 1 else 0
        yield next(streams[k])


def _passes(tasks: list[Task], seed: int, k: int) -> Iterator[Task]:
    for epoch in itertools.count():
        order = list(range(len(tasks)))
        random.Random(f"{seed}:{k}:{epoch}").shuffle(order)
        for i in order:
            yield tasks[i]
