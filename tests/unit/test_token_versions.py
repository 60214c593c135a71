"""Weights updated in flight (`actor.in_flight_on_update = "keep"`): each token's version from the engine's
per-request token counts, on the wire (validated) and in the learner's admission and per-token staleness."""

import numpy as np
import pytest

from actors.in_flight import TokenVersions, by_request
from learner.batching import Admission
from tests.support.transport_helpers import make_group
from transport import wire


def counts_of(rid: str, counts: dict[str, int]) -> dict[int, int]:
    return by_request(counts, {rid}).get(rid, {})


def test_engine_request_ids_map_to_our_request_and_completion_index():
    counts = {"a0-7-abcd-1f2e3d4c": 5, "0_a0-7-abcd-1f2e3d4c": 3, "12_a0-7-abcd-1f2e3d4c": 9,
              "0_a0-77-ffff-00000000": 100, "a0-7-abcd": 4}
    assert counts_of("a0-7-abcd", counts) == {0: 4, 12: 9}  # the un-suffixed id wins for index 0 (last seen)
    assert counts_of("a0-7-abcd", {"0_a0-7-abcd-1f2e3d4c": 3, "1_a0-7-abcd-1f2e3d4c": 0}) == {0: 3, 1: 0}
    assert counts_of("a0-7", {"0_a0-77-ffff-0": 1}) == {}  # another request's id is not ours


def test_each_token_gets_the_version_that_sampled_it():
    tv = TokenVersions()
    tv.begin("r", 2)
    tv.begin("other", 2)
    # v3 arrives: completion 0 had 4 tokens, completion 1 was scheduled with none, completion 2 not yet
    tv.mark(3, {"0_r-x": 4, "1_r-x": 0})
    # v4 arrives: completion 0 at 6 tokens; 1 is gone from the engine (reported before, no count now: no
    # boundary known, its tokens stay with the last report's v3, the oldest they can be, never v4)
    tv.mark(4, {"0_r-x": 6, "2_r-x": 1})
    out = tv.end("r", np.array([8, 3, 2]), [0, 1, 2])
    assert out.tolist() == [0, 0, 0, 0, 1, 1, 2, 2] + [1, 1, 1] + [1, 2]
    # one reported finished (its final count) keeps all its tokens before that mark, whatever comes later
    tv.begin("f", 2)
    tv.mark(3, {"0_f": 2, "1_f": 1})
    tv.mark(4, {"1_f": 3})
    tv.mark(5, {})
    assert tv.end("f", np.array([2, 4]), [0, 1]).tolist() == [0, 0] + [0, 1, 1, 2]
    # completions listed in another order than the engine's indices
    tv.begin("s", 5)
    tv.mark(6, {"0_s": 1, "1_s": 2})
    assert tv.end("s", np.array([3, 3]), [1, 0]).tolist() == [0, 0, 1, 0, 1, 1]
    assert tv.end("other", np.array([2])).tolist() == [4, 4]  # not started before v3, v4 or v6: all of v6
    tv.begin("q", 9)
    assert tv.end("q", np.array([4])).size == 0  # no update while it ran: nothing to send


def test_requests_an_update_would_make_too_stale_are_named():
    tv = TokenVersions()
    for rid, v in (("a", 3), ("b", 4), ("c", 5)):
        tv.begin(rid, v)
    assert sorted(tv.too_stale(6, 1)) == ["a", "b"]
    tv.forget("a")
    assert tv.too_stale(6, 1) == ["b"]


def with_versions(g, versions):
    g.versions = np.asarray(versions, np.uint8)
    return g


def test_versions_travel_on_the_wire_and_are_validated():
    g = with_versions(make_group("a0:1", n=2, length=3, version=5), [0, 1, 1, 0, 0, 2])
    back = wire.decode([bytes(f) for f in wire.encode(g)])
    assert back.token_versions().tolist() == [5, 6, 6, 5, 5, 7]
    assert (back.oldest_version, back.newest_version) == (5, 7)
    plain = wire.decode([bytes(f) for f in wire.encode(make_group("a0:2", n=2, length=3, version=5))])
    assert plain.versions.size == 0 and plain.token_versions().tolist() == [5] * 6
    for bad, why in (([0, 1, 0, 0, 0, 0], "go back to older weights"), ([0, 0], "versions has 2 entries for 6")):
        with pytest.raises(wire.WireError, match=why):
            wire.decode([bytes(f) for f in wire.encode(with_versions(make_group("a0:3", n=2, length=3), bad))])


def test_admission_judges_the_oldest_token_and_counts_staleness_per_token():
    a = Admission(max_staleness=1)
    late_start = with_versions(make_group("x:0", n=2, length=2, version=2), [1, 1, 1, 2])  # oldest: v3
    assert a.admit(late_start, step=4)
    early = with_versions(make_group("x:1", n=2, length=2, version=2), [0, 1, 1, 1])  # a token of v2
    assert not a.admit(early, step=4)
    keep, stale = a.check_batch([late_start, early, make_group("x:2", n=1, length=3, version=4)], step=4)
    assert [g.group_id for g in keep] == ["x:0", "x:2"] and [g.group_id for g in stale] == ["x:1"]
    st = a.take_stats()
    assert (st["staleness_0"], st["staleness_1"]) == (1 + 3, 3)  # tokens, not samples
    assert st["staleness_mean"] == pytest.approx(3 / 7)


def test_prompt_kv_is_salted_with_the_version_its_request_starts_under():
    from actors.engine import request_prompt
    from config.schema import ActorConfig

    a = ActorConfig()
    ids = wire.PromptItem(7, "", "4", "synthetic", prompt_token_ids=[5, 6, 7])
    text = wire.PromptItem(8, "2+2=", "4", "synthetic")
    assert request_prompt(a, ids, 3) == {"prompt_token_ids": [5, 6, 7], "cache_salt": "brorl-v3"}
    assert request_prompt(a, text, 3) == {"prompt": "2+2=", "cache_salt": "brorl-v3"}
    # a new version's requests key their prompt blocks apart from the older version's; one version's share
    assert request_prompt(a, ids, 4)["cache_salt"] != request_prompt(a, ids, 3)["cache_salt"]
    assert request_prompt(a, text, 4) == request_prompt(a, text, 4)
    off = ActorConfig(prefix_cache_per_version=False)
    assert request_prompt(off, ids, 3) == {"prompt_token_ids": [5, 6, 7]}
