"""The live display of `brorl run`: in a log, one line per completed step and each step once (no repeats
while the job waits); on a terminal, a `rich` panel with a progress bar, redrawn in place."""

import io

from cli.display import Display


def rows(n):
    return [{"step": s, "rollout_reward": 0.1 * s, "pass_rate": 0.5, "loss": 0.01, "samples_per_s": 100.0,
             "wait_s": 1.0, "train_s": 2.0, "broadcast_s": 0.1, "staleness_mean": 0.5, "staleness_0": 10.0}
            for s in range(1, n + 1)]


def test_in_a_log_each_completed_step_is_one_line_once():
    out = io.StringIO()
    d = Display(steps=5, out=out, live=False)
    d.update([], 0, [])
    d.update([], 0, [])  # still waiting: said once
    d.update(rows(2), 0, [])
    d.update(rows(2), 0, [])  # nothing new: nothing printed
    d.update(rows(5), 0, [])  # three steps since: three lines
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[brorl run] waiting for the first step")
    assert [ln.split()[3] for ln in lines[1:]] == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert "reward 0.300" in lines[3]


def test_on_a_terminal_a_panel_with_a_progress_bar_is_redrawn():
    out = io.StringIO()
    d = Display(steps=4, out=out, live=True)
    d.update(rows(1), 0, [{"step": 0, "pass_at_1": 0.12}])
    d.update(rows(2), 1, [{"step": 0, "pass_at_1": 0.12}, {"step": 2, "version": 2, "error": "no verifier"}])
    d.close()
    text = out.getvalue()
    assert "brorl run" in text and "step    2/4" in text and "0:12%" in text and "process restarts 1" in text
    assert "2:error" in text  # a held-out estimate that could not be made (its row has no pass@1)
    assert "━" in text  # rich's progress bar
    assert "\x1b[" in text  # drawn in place with terminal controls


def test_a_roles_news_is_one_line_in_a_log_and_above_the_panel_on_a_terminal():
    news = "[brorl run] learner STALL: no step for 61 s (at step 3): every one of the 44 groups … — fix: easier tasks"
    out = io.StringIO()
    d = Display(steps=4, out=out, live=False)
    d.say(news)
    assert out.getvalue() == news + "\n"
    out = io.StringIO()
    d = Display(steps=4, out=out, live=True)
    d.update(rows(1), 0, [])
    d.say(news)
    d.update(rows(2), 0, [])
    d.close()
    text = out.getvalue()
    assert news in text and text.rindex("step    2/4") > text.index(news)  # the panel is drawn on below it
