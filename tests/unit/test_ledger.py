"""The ledger audit (`learner.ledger`): a prompt may be granted again only after it came back."""

import json

import pytest

from learner.ledger import LedgerError, account, check


def write(tmp_path, rows):
    (tmp_path / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return account(tmp_path)


START = {"start": 0, "epoch": "e", "next_id": 0, "pending": []}


def test_regrants_after_a_return_or_a_resume_pass(tmp_path):
    acc = write(tmp_path, [
        START,
        {"granted": [0, 1, 2], "actor": "a", "incarnation": "x"},
        {"returned": [1], "actor": "a", "reason": "stale"},
        {"granted": [1, 3], "actor": "b", "incarnation": "y"},
        {"step": 1, "trained": [0, 1], "dropped": []},
        # a resume from the checkpoint of step 1: 2 and 3 were pending, granted first, then 4
        {"start": 1, "epoch": "f", "next_id": 4, "pending": [2, 3]},
        {"granted": [2, 3, 4], "actor": "a", "incarnation": "z"},
        {"step": 2, "trained": [2, 3], "dropped": [4]},
    ])
    check(acc, 2, per_step=2)
    assert acc.regranted == []


@pytest.mark.parametrize("rows, bad", [
    # a fresh prompt handed out twice
    ([{"granted": [0, 1], "actor": "a"}, {"granted": [1], "actor": "b"}], [1]),
    # returned once, granted twice after
    ([{"granted": [0, 1], "actor": "a"}, {"returned": [1], "actor": "a", "reason": "handed_back"},
      {"granted": [1], "actor": "b"}, {"granted": [1], "actor": "c"}], [1]),
    # an id behind the cursor that was not pending
    ([{"granted": [0, 1], "actor": "a"}, {"step": 1, "trained": [0, 1], "dropped": []},
      {"start": 1, "epoch": "f", "next_id": 2, "pending": []}, {"granted": [0], "actor": "a"}], [0]),
])
def test_a_prompt_granted_again_without_coming_back_is_named(tmp_path, rows, bad):
    acc = write(tmp_path, [START, *rows])
    assert acc.regranted == bad
    with pytest.raises(LedgerError, match=rf"granted again without having come back: \[{bad[0]}\]"):
        check(acc, acc.steps[-1] if acc.steps else 0)
