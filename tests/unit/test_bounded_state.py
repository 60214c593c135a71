"""A long job's tables stay bounded: the task cache holds only prompts still in play, duplicate tables are
kept for the most recent senders only, expected checksums for the last versions, reminders and actor
errors are capped."""

import zmq.asyncio

from actors.stats import ActorStats
from config.loader import load_config
from learner.batching import Dispatcher, TaskStream
from learner.membership import Membership
from transport.zmq_transport import MAX_SENDERS, Endpoints, Limits, RolloutReceiver, Security


def test_task_cache_holds_only_prompts_in_play():
    cfg = load_config("tiny-cpu", {"job.prompts_per_step": 4, "job.max_staleness": 1})
    d = Dispatcher(cfg)
    for step in range(50):
        items = d.grant("a", 4, 100, step=step, actor_version=step)
        d.commit([i.prompt_id for i in items])
    assert d.next_id == 200 and len(d.tasks) <= 8
    items = d.grant("a", 4, 100, step=50, actor_version=50)
    d.give_back([items[0].prompt_id])
    assert d.tasks[items[0].prompt_id][0].prompt == items[0].prompt  # a prompt in play is still there


def test_task_stream_forgets_and_says_so():
    ts = TaskStream(load_config("tiny-cpu"))
    first = ts[0][0].prompt
    ts[99]
    ts.forget_before(90)
    assert len(ts) == 10 and ts[95] is not None
    try:
        ts[0]
        raise AssertionError("a forgotten task came back")
    except KeyError as e:
        assert "forgotten" in str(e)
    assert TaskStream(load_config("tiny-cpu"))[0][0].prompt == first  # deterministic: a resume rebuilds it


def test_membership_tables_are_capped():
    m = Membership(timeout_s=5)
    for v in range(1000):
        m.expect(v, f"sum-{v}")
    assert sorted(m.expected) == list(range(984, 1000))
    for i in range(5000):
        m.may_remind(f"ghost-{i}")
    assert len(m._reminded) <= 1025


def test_actor_errors_are_capped():
    st = ActorStats()
    for i in range(1000):
        st.errors.append(f"e{i}")
    assert len(st.errors) == 100 and st.errors[-1] == "e999"


def test_duplicate_tables_kept_for_recent_senders_only():
    ctx = zmq.asyncio.Context()
    try:
        rx = RolloutReceiver(ctx, Endpoints("127.0.0.1", 0, 0, 0), Security(), Limits(10))
        for i in range(MAX_SENDERS + 500):
            assert not rx.is_duplicate(f"a{i}:inc:0")
        assert len(rx._seen) == MAX_SENDERS
        assert rx.is_duplicate(f"a{MAX_SENDERS + 499}:inc:0")  # a recent sender is still deduplicated
        rx.sock.close(linger=0)
    finally:
        ctx.term()


def test_wrong_weights_checksum_refuses_the_actor_until_it_reports_the_right_one():
    from transport import wire

    m = Membership(timeout_s=5)
    m.expect(4, "good")
    m.heartbeat(wire.Heartbeat("a0", 4, 0, 0, "garbled"))
    assert m.bad_weights == {"a0": 4} and m.resync and m.checksum_mismatch == 1
    m.resync = False
    m.heartbeat(wire.Heartbeat("a0", 4, 0, 0, "garbled"))  # the same report again: one incident, not two
    assert m.checksum_mismatch == 1 and not m.resync
    m.heartbeat(wire.Heartbeat("a0", 4, 0, 0, "good"))  # re-broadcast received
    assert m.bad_weights == {} and m.checksum_ok == 1


def test_role_logs_rotate_while_the_child_keeps_writing(tmp_path):
    """copy-truncate: a child appending to its log keeps writing into the same, emptied file."""
    from cli.launcher import Launcher

    cfg = load_config("tiny-cpu", {"run.run_dir": str(tmp_path), "run.log_max_mb": 0.001})
    la = Launcher(cfg, quiet=True)
    la.logs.mkdir(parents=True)
    with open(la.logs / "actor-0.log", "ab", buffering=0) as child:
        child.write(b"x" * 5000)
        la._rotate("actor-0")
        child.write(b"after\n")
    assert (la.logs / "actor-0.log.1").stat().st_size == 5000
    assert (la.logs / "actor-0.log").read_bytes() == b"after\n"
