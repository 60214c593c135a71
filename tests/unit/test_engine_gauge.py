"""How full an actor's engine was: vLLM's scheduler stats per engine step, summed into heartbeat counters."""

from actors.stats import ActorStats, EngineGauge


def test_the_engine_gauge_sums_vllms_scheduler_stats_per_engine_step_and_the_heartbeat_carries_them():
    from vllm.v1.metrics.stats import SchedulerStats

    st = ActorStats()
    st.gauge.record(None)  # a batch of outputs without stats is no engine step
    first = st.heartbeat(0.0)
    for running, waiting, kv in ((32, 0, 0.25), (16, 4, 0.5), (0, 0, 0.0)):
        st.gauge.record(SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv))
    hb = st.heartbeat(0.0)
    assert (hb["engine_steps"], hb["running_seqs"], hb["waiting_seqs"], hb["kv_use"]) == (3, 48, 4, 0.75)
    assert st.gauge.max_running == 32
    assert EngineGauge.means(first, hb) == {"mean_running_seqs": 16.0, "mean_waiting_seqs": 4 / 3, "mean_kv_use": 0.25}
    rows = [{f"actor_{k}": v for k, v in first.items()}, {f"actor_{k}": v for k, v in hb.items()}]
    assert EngineGauge.means(rows[0], rows[1], prefix="actor_")["mean_running_seqs"] == 16.0
    assert EngineGauge.means(hb, hb) == {"mean_running_seqs": 0.0, "mean_waiting_seqs": 0.0, "mean_kv_use": 0.0}
