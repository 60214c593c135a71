"""When `brorl run` restarts a learner that died (cli/learner_restart.py): the policy (budget, back-off, which
exits restart), the ledger's `start` row as the sign that it served, and the launcher's loop around it with
stand-in role processes (a learner that SIGKILLs itself once, one that fails before serving)."""

import json
import signal
import socket
import sys
import textwrap

from actors.verifier_set import EXIT_REFUSED
from cli.learner_restart import RESET_AFTER_S, RestartPolicy, busy_ports, checkpoint_step, ledger_size, served_since

KILLED = -signal.SIGKILL


def test_a_killed_learner_restarts_with_a_doubling_back_off_until_the_budget_is_spent():
    p = RestartPolicy(budget=3, backoff_s=1.0)
    verdicts = [p.decide(KILLED, served=True, lived_s=5.0) for _ in range(4)]
    assert [(v.restart, v.delay_s, v.n) for v in verdicts[:3]] == [(True, 1.0, 1), (True, 2.0, 2), (True, 4.0, 3)]
    assert not verdicts[3].restart and "run.max_learner_restarts = 3" in verdicts[3].reason
    assert p.total == 3
    assert p.line(verdicts[0], 4) == ("learner died (signal 9); restarting from checkpoint step 4 in 1 s "
                                      "(restart 1 of 3)")
    assert p.line(verdicts[3], 4).startswith("learner died (signal 9); not restarted: it was restarted 3")


def test_the_back_off_is_capped_and_a_long_life_starts_the_count_afresh():
    p = RestartPolicy(budget=10, backoff_s=8.0)
    assert [p.decide(KILLED, True, 1.0).delay_s for _ in range(5)] == [8.0, 16.0, 32.0, 60.0, 60.0]
    v = p.decide(KILLED, True, RESET_AFTER_S)
    assert v.restart and v.n == 1 and v.delay_s == 8.0 and p.total == 6
    q = RestartPolicy(3, 0.0)
    assert q.line(q.decide(1, True, 1.0), None) == (
        "learner died (exit status 1); restarting from the start (no checkpoint yet) (restart 1 of 3)")


def test_which_exits_restart():
    def restarts(rc, served):
        return RestartPolicy(budget=3, backoff_s=0.0).decide(rc, served, 1.0).restart

    assert restarts(KILLED, served=True) and restarts(-signal.SIGSEGV, served=True)
    assert restarts(1, served=True)            # a crash after it trained or served
    assert restarts(KILLED, served=False)      # killed while loading (the OOM killer): not its config's fault
    assert not restarts(1, served=False)       # a config, data or checkpoint error at start: it would fail again
    assert not restarts(2, served=False)       # a ConfigError
    assert not restarts(EXIT_REFUSED, served=True)  # it said restarting would not help
    assert not restarts(0, served=True)        # it finished
    off = RestartPolicy(budget=0, backoff_s=1.0).decide(KILLED, True, 1.0)
    assert not off.restart and off.reason == "run.max_learner_restarts = 0 (resume with --resume)"


def test_served_is_a_start_row_at_the_mark_and_the_checkpoint_step_is_latest(tmp_path):
    assert ledger_size(tmp_path) == 0 and not served_since(tmp_path, 0) and checkpoint_step(tmp_path) is None
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps({"start": 0, "epoch": "a", "next_id": 0, "pending": []}) + "\n"
                      + json.dumps({"granted": [0, 1], "actor": "a0", "incarnation": "x"}) + "\n")
    whole = ledger.stat().st_size
    assert served_since(tmp_path, 0) and not served_since(tmp_path, 40)
    assert ledger_size(tmp_path) == whole and not served_since(tmp_path, whole)  # a learner that wrote nothing
    with open(ledger, "a") as f:
        f.write('{"granted": [2, 3], "act')  # a learner killed in the middle of a write
    mark = ledger_size(tmp_path)
    assert mark == whole
    with open(ledger, "r+") as f:  # the next learner cuts the torn line off and writes its start row there
        f.truncate(mark)
        f.seek(mark)
        f.write(json.dumps({"start": 6, "epoch": "c", "next_id": 12, "pending": []}) + "\n")
    assert served_since(tmp_path, mark)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-12\n")
    assert checkpoint_step(tmp_path) == 12


def test_a_listening_socket_holds_a_port_and_a_closed_one_does_not():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    assert busy_ports("127.0.0.1", (port, 0)) == [port]
    s.close()
    assert busy_ports("127.0.0.1", (port,)) == []


# A stand-in for `brorl learner` / `brorl actor`: the learner writes its ledger `start` row (or not) and then
# dies as told by the run folder's `plan` file; an actor waits to be stopped.
ROLE = textwrap.dedent("""
    import json, os, pathlib, signal, sys, time
    args = sys.argv[1:]
    if args[0] == "actor":
        time.sleep(60)
        sys.exit(0)
    run = pathlib.Path(args[args.index("--config") + 1]).parent
    plan = (run / "plan").read_text().split()
    n = len(list(run.glob("learner-*")))
    (run / f"learner-{n}").write_text(" ".join(args))
    what = plan[min(n, len(plan) - 1)]
    if what != "refuse":
        with open(run / "ledger.jsonl", "a") as f:
            f.write(json.dumps({"start": n, "epoch": str(n), "next_id": 0, "pending": []}) + "\\n")
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit({"refuse": 1, "finish": 0, "kill": 0}[what])
""")


def _launcher(tmp_path, monkeypatch, plan: str, **over):
    import cli.launcher
    from config.loader import load_config
    from transport.ports import free_ports

    script = tmp_path / "role.py"
    script.write_text(ROLE)
    monkeypatch.setattr(cli.launcher, "brorl_command", lambda *a: [sys.executable, str(script), *a])
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan").write_text(plan)
    port = free_ports(3)
    cfg = load_config("tiny-cpu", {"run.run_dir": str(run), "run.learner_restart_backoff_s": 0.0,
                                   "transport.work_port": port, "transport.rollout_port": port + 1,
                                   "transport.control_port": port + 2, **over})
    return cli.launcher.Launcher(cfg, quiet=True, gpus=0), run


def test_the_launcher_restarts_a_killed_learner_with_resume_and_keeps_its_actor(tmp_path, monkeypatch, capsys):
    la, run = _launcher(tmp_path, monkeypatch, "kill finish")
    la.start()
    actor = la.procs["actor-0"]
    try:
        assert la.wait() == 0
        assert actor.poll() is None  # the actor was left running through the restart
    finally:
        la.stop(timeouts=(5.0, 5.0))
    assert "--resume" not in (run / "learner-0").read_text() and "--resume" in (run / "learner-1").read_text()
    assert la.learner_restarts.total == 1 and la.restarts == 0
    assert "learner died (signal 9); restarting from the start (no checkpoint yet) (restart 1 of 3)" \
        in capsys.readouterr().out


def test_the_launcher_does_not_restart_a_learner_that_fails_before_serving_nor_past_its_budget(
        tmp_path, monkeypatch, capsys):
    la, run = _launcher(tmp_path, monkeypatch, "refuse")
    la.start()
    try:
        assert la.wait() == 1
    finally:
        la.stop(timeouts=(5.0, 5.0))
    assert not (run / "learner-1").exists()
    assert "learner died (exit status 1); not restarted: it failed before it started serving" in capsys.readouterr().out

    (tmp_path / "b").mkdir()
    la, run = _launcher(tmp_path / "b", monkeypatch, "kill", **{"run.max_learner_restarts": 1})
    la.start()
    try:
        assert la.wait() == -signal.SIGKILL
    finally:
        la.stop(timeouts=(5.0, 5.0))
    assert (run / "learner-1").exists() and not (run / "learner-2").exists()
    assert "not restarted: it was restarted 1 times in a row" in capsys.readouterr().out
