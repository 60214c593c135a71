"""The staleness rule has one home (`transport/staleness.py`), and the parts that bound staleness — the
dispatcher's grants, admission, the actor's gate, in-flight aborts, the fleet simulator — agree with it at
the boundary."""

import re
from pathlib import Path

import numpy as np

from transport.staleness import fresh, staleness, steps_left

ROOT = Path(__file__).resolve().parents[2]


def test_the_rule():
    assert staleness(7, 5) == 2 and list(staleness(7, np.array([7, 6, 3]))) == [0, 1, 4]
    assert fresh(7, 6, 1) and not fresh(7, 5, 1) and fresh(7, 7, 0) and not fresh(7, 6, 0)
    assert steps_left(5, 5, 1) == 2  # trainable at step 5 and 6
    assert steps_left(7, 5, 1) == 0  # too old at 7 already
    for k in range(4):
        for v in range(6):
            for s in range(v, v + 6):
                assert fresh(s, v, k) == (steps_left(s, v, k) > 0)


def test_no_other_copy_of_the_rule():
    """A difference compared with max_staleness anywhere else is a second copy of the rule."""
    copy = re.compile(r"-\s*[\w.()]+\s*(<=|>|<|>=)\s*[\w.]*max_staleness|max_staleness\s*-\s*[\w.]*step")
    found = [f"{p.relative_to(ROOT)}:{i}" for pkg in ("learner", "actors", "fleet", "cli", "transport", "config")
             for p in (ROOT / pkg).rglob("*.py") if p.name != "staleness.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if copy.search(line)]
    assert found == []


def test_the_parts_agree_with_the_rule_at_the_boundary():
    from types import SimpleNamespace

    from actors.in_flight import TokenVersions
    from actors.weight_sync import SyncState, WeightSync
    from learner.batching import Admission

    adm = Admission(max_staleness=1)
    g = SimpleNamespace(oldest_version=5)
    assert adm.admit(g, 6) and not adm.admit(g, 7)

    ws = WeightSync("a0", 1, None, lambda *a, **k: None)
    ws.state, ws.version = SyncState.READY, 5
    ws.latest = 6
    assert ws.may_admit() and not ws.gated_by_staleness()
    ws.latest = 7
    assert not ws.may_admit() and ws.gated_by_staleness()

    tv = TokenVersions()
    tv.begin("r1", 5)
    tv.begin("r2", 6)
    assert tv.too_stale(7, 1) == ["r1"]
