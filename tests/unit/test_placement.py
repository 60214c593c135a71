"""GPU placement of a one-host job (`config/placement.py`): each role's GPUs, double booking and too few
GPUs refused with the fields named, and the CUDA_VISIBLE_DEVICES each role is started with."""

import tomllib

import pytest

from config.loader import ConfigError, load_config, to_toml, validate
from config.placement import Placement, cpu_cores, place, visible_env


def cfg(**over):
    return load_config("tiny-cpu", {"learner.device": "cuda", **over})


def test_defaults_put_the_learner_first_and_one_actor_per_gpu_after_it():
    assert place(cfg(**{"actor.num_actors": 3}), 4) == Placement([0], [[1], [2], [3]])
    assert place(cfg(**{"actor.num_actors": 2}), 4) == Placement([0], [[1], [2]])  # GPU 3 left free
    assert place(cfg(**{"learner.device": "cuda:1"}), 2) == Placement([1], [[0]])
    assert place(cfg(**{"learner.device": "cpu", "actor.num_actors": 2}), 2) == Placement([], [[0], [1]])


def test_learner_ranks_and_tensor_parallel_actors_take_consecutive_gpus():
    c = cfg(**{"learner.devices": 2, "learner.backend": "deepspeed", "actor.num_actors": 2,
               "actor.tensor_parallel_size": 2})
    assert place(c, 6) == Placement([0, 1], [[2, 3], [4, 5]])
    c = cfg(**{"learner.gpus": [3], "actor.gpus": [0, 1, 2], "actor.num_actors": 3})
    assert place(c, 4) == Placement([3], [[0], [1], [2]])


def test_too_few_gpus_fail_at_launch_naming_the_fields():
    with pytest.raises(ValueError, match=r"too few GPUs.*actor.num_actors \(4\).*shows 4"):
        place(cfg(**{"actor.num_actors": 4}), 4)
    with pytest.raises(ValueError, match=r"learner.device = 'cuda' but this host shows no GPU"):
        place(cfg(), 0)
    with pytest.raises(ValueError, match=r"actor.gpus names GPU 5: this host shows 4"):
        place(cfg(**{"actor.gpus": [5]}), 4)
    with pytest.raises(ValueError, match=r"learner's GPU 2 .*shows 2"):
        place(cfg(**{"learner.device": "cuda:2"}), 2)
    with pytest.raises(ValueError, match=r"booked twice: the learner's"):
        place(cfg(**{"learner.device": "cuda:1", "actor.gpus": [1], "transport.weight_backend": "nccl"}), 2)


def test_no_gpu_places_nothing_and_the_cpu_job_runs_as_it_is():
    assert place(load_config("tiny-cpu", {}), 0) == Placement()


@pytest.mark.parametrize("over, match", [
    ({"learner.gpus": [0], "actor.gpus": [0], "actor.kv_cache_gib": 0}, r"GPU 0 is booked twice: in learner.gpus \[0\] and in actor.gpus \[0\]; "
     r"to share it .*set actor.kv_cache_gib"),
    ({"actor.gpus": [1, 1], "actor.num_actors": 2}, r"actor.gpus \[1, 1\] books GPU 1 twice"),
    ({"learner.gpus": [0, 1]}, r"learner.gpus \[0, 1\] lists 2 GPU\(s\) for learner.devices = 1"),
    ({"actor.gpus": [1, 2]}, r"actor.gpus \[1, 2\] lists 2 GPU\(s\); actor.num_actors \(1\)"),
    ({"learner.device": "cpu", "learner.gpus": [0]}, r"learner.gpus \[0\] is set but learner.device = 'cpu'"),
    ({"learner.device": "cuda:1", "learner.gpus": [1]}, r"both choose the learner's GPU"),
])
def test_double_booking_and_miscounts_fail_at_load(over, match):
    with pytest.raises(ConfigError, match=match):
        cfg(**over)


SHARED = {"learner.gpus": [0], "actor.gpus": [0], "transport.weight_backend": "ipc", "actor.kv_cache_gib": 16,
          "actor.gpu_memory_utilization": 0.3}


def test_the_learner_and_an_actor_share_one_gpu_when_the_job_is_set_up_for_it():
    c = cfg(**SHARED)
    assert place(c, 1) == Placement([0], [[0]])
    assert place(cfg(**{**SHARED, "transport.weight_backend": "gloo"}), 1) == Placement([0], [[0]])  # slower, allowed
    assert place(c, 1).describe() == "learner GPU 0, actor-0 GPU 0 (shared with the learner)"
    # learner.device names the GPU instead of learner.gpus: the same rule at launch
    c = cfg(**{**{k: v for k, v in SHARED.items() if k != "learner.gpus"}, "learner.device": "cuda:0"})
    assert place(c, 1) == Placement([0], [[0]])


def test_ipc_weights_need_every_actor_on_the_learners_gpu():
    with pytest.raises(ValueError, match=r'transport.weight_backend = "ipc" maps the learner\'s GPU memory .* actors '
                                         r'are placed on GPU 1, which they alone see: set transport.weight_backend = "nccl"'):
        place(cfg(**{"transport.weight_backend": "ipc"}), 2)
    assert place(load_config("tiny-cpu", {"transport.weight_backend": "ipc"}), 0) == Placement()  # CPU: shared memory


@pytest.mark.parametrize("field, value, match", [
    ("transport.weight_backend", "nccl", r"set transport.weight_backend = \"ipc\" \(it is 'nccl': NCCL refuses"),
    ("actor.kv_cache_gib", 0, r"set actor.kv_cache_gib \(the engine's KV cache"),
    ("actor.gpu_memory_utilization", 0.85, r"set actor.gpu_memory_utilization ≤ 0.5 \(it is 0.85"),
])
def test_a_shared_gpu_without_its_settings_is_refused_naming_the_one_missing(field, value, match):
    with pytest.raises(ConfigError, match=match) as e:
        cfg(**{**SHARED, field: value})
    assert e.value.args[0].count("set ") == 1  # only the missing setting is named
    with pytest.raises(ValueError, match=r"booked twice: the learner's .*" + match):
        place(load_config("tiny-cpu", {"learner.device": "cuda:0", "actor.gpus": [0], **{
            k: v for k, v in {**SHARED, field: value}.items() if k not in ("learner.gpus", "actor.gpus")}}), 1)


def test_fp8_actors_need_gpus_and_reach_the_engine_as_vllms_quantization():
    from actors.engine import engine_kwargs

    c = load_config("tiny-cpu", {"actor.quantization": "fp8"})
    with pytest.raises(ValueError, match=r"actor.quantization = 'fp8' needs GPU actors"):
        place(c, 0)
    assert place(cfg(**{"actor.quantization": "fp8"}), 2) == Placement([0], [[1]])
    assert engine_kwargs(c.model, c.actor)["quantization"] == "fp8"
    assert "quantization" not in engine_kwargs(c.model, load_config("tiny-cpu").actor)  # bf16: vLLM's default path


def test_each_role_sees_only_its_gpus_through_the_launchers_own_view():
    assert visible_env([0, 2], None) == "0,2"
    assert visible_env([1, 2], "4,6,7") == "6,7"  # the launcher itself sees physical GPUs 4, 6, 7


def test_the_launcher_starts_each_role_with_its_gpus_and_records_the_placement(tmp_path, monkeypatch):
    from cli.launcher import Launcher

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    la = Launcher(cfg(**{"actor.num_actors": 2, "learner.device": "cuda:2", "run.run_dir": str(tmp_path)}),
                  quiet=True, gpus=3)
    assert [la.device_env(n) for n in ("learner", "actor-0", "actor-1")] == [
        {"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    # the learner sees its one GPU as cuda:0: the config the roles load says so, and where each role is
    assert (la.cfg.learner.device, la.cfg.learner.gpus, la.cfg.actor.gpus) == ("cuda", [2], [0, 1])
    with pytest.raises(ConfigError, match="GPU placement: too few GPUs"):
        Launcher(cfg(**{"actor.num_actors": 3}), quiet=True, gpus=3)
    assert Launcher(load_config("tiny-cpu", {}), quiet=True, gpus=0).device_env("actor-0") == {}


def test_cpu_actors_on_one_host_get_cores_of_their_own():
    # vLLM's own binding would pin every engine to the first core: two actors on 2 cores take one each
    assert [cpu_cores(i, 2, [0, 1]) for i in range(2)] == ["0", "1"]
    assert [cpu_cores(i, 3, [4, 5, 6, 7, 8, 9, 10]) for i in range(3)] == ["4,5", "6,7", "8,9"]
    assert [cpu_cores(i, 3, [0, 1]) for i in range(3)] == ["0", "1", "0"]  # more actors than cores: round them
    assert cpu_cores(0, 1, [0, 1]) is None  # one actor: vLLM binds as it likes


def test_the_launcher_binds_each_cpu_actors_engine_unless_the_job_sets_it(tmp_path, monkeypatch):
    from cli.launcher import Launcher

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {2, 3})
    la = Launcher(load_config("tiny-cpu", {"actor.num_actors": 2, "run.run_dir": str(tmp_path)}), quiet=True, gpus=0)
    assert [la.device_env(n) for n in ("learner", "actor-0", "actor-1")] == [
        {}, {"VLLM_CPU_OMP_THREADS_BIND": "2"}, {"VLLM_CPU_OMP_THREADS_BIND": "3"}]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert la.device_env("actor-1") == {}  # the job's own setting reaches the engine as it is


def test_ray_custom_resources_are_checked_against_what_the_cluster_offers():
    from cli.cluster import missing_resources

    c = load_config("tiny-cpu", {"actor.num_actors": 2, "run.ray_learner_resources": {"learner_node": 1},
                                 "run.ray_actor_resources": {"actor_node": 1}})
    missing_resources(c, {"CPU": 8.0, "learner_node": 1.0, "actor_node": 2.0})  # enough: nothing to say
    # one actor node unit short: Ray would keep the second actor pending and the job would never start
    with pytest.raises(ConfigError, match=r"run.ray_actor_resources ask for 2 of Ray resource 'actor_node' in all, "
                                          r"and the cluster offers 1"):
        missing_resources(c, {"CPU": 8.0, "learner_node": 1.0, "actor_node": 1.0})
    with pytest.raises(ConfigError, match="Ray resources need a name and an amount > 0"):
        load_config("tiny-cpu", {"run.ray_actor_resources": {"actor_node": 0}})
    # the run folder's config keeps them
    assert validate(tomllib.loads(to_toml(c))).run.ray_learner_resources == {"learner_node": 1.0}


def test_cpu_actors_on_one_cluster_node_claim_distinct_core_slots_freed_when_their_holder_goes(tmp_path):
    """Each CPU actor host on a node takes the lowest free slot (a lock held while it lives): two take 0 and 1,
    a third finds none; once slot 0's holder is gone, a new one (a restarted actor) takes 0 again."""
    from cli.cluster import claim_core_slot, node_actor_capacity

    a, b = claim_core_slot("job", 2, str(tmp_path)), claim_core_slot("job", 2, str(tmp_path))
    assert (a[0], b[0]) == (0, 1)
    assert claim_core_slot("job", 2, str(tmp_path)) is None
    assert claim_core_slot("other-job", 2, str(tmp_path))[0] == 0  # another job's slots are its own
    a[1].close()
    assert claim_core_slot("job", 2, str(tmp_path))[0] == 0
    # the slots a node has: what its custom resources allow, else the job's actor count
    assert node_actor_capacity({"actor_node": 1}, {"actor_node": 2.0, "CPU": 4.0}, 4) == 2
    assert node_actor_capacity({"actor_node": 2}, {"actor_node": 2.0}, 4) == 1
    assert node_actor_capacity({}, {"CPU": 64.0}, 3) == 3


def test_the_end_to_end_benchmark_places_a_multi_gpu_learner_before_its_actors_and_loads():
    """bench.e2e's job on GPUs: `--learner-gpus 2` gives the learner two ranks on the first GPUs and the
    actors the next ones; the job passes the config's own placement checks; `--set` pairs are parsed."""
    from bench.e2e import job, overrides

    preset, over = job("qwen2-1.5b", 2, 8, "/m", first_gpu=4, learner_gpus=2)
    assert over["learner.gpus"] == [4, 5] and over["learner.devices"] == 2 and over["actor.gpus"] == [6, 7]
    cfg = load_config(preset, {**over, "learner.gpus": [0, 1], "actor.gpus": [2, 3]})
    p = place(cfg, 4)
    assert p.learner == [0, 1] and p.actors == [[2], [3]]
    assert overrides(["learner.compile=false", "actor.length_dist=fixed", "learner.lr=1e-6"]) == {
        "learner.compile": False, "actor.length_dist": "fixed", "learner.lr": 1e-6}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        overrides(["learner.compile"])
    # `--samples-per-step`: more prompts a step at every N, the same samples whatever N
    for n, prompts in ((16, 128), (512, 4)):
        _, o = job("qwen2-1.5b", 1, 8, "/m", n=n, samples=2048)
        assert (o["job.prompts_per_step"], o["actor.prompts_per_request"], o["job.n_samples"]) == (prompts, prompts, n)


def test_the_learner_takes_expandable_cuda_segments_unless_the_user_chose_an_allocator():
    from cli.learner import ALLOCATOR, allocator_default

    env = {}
    allocator_default(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": ALLOCATOR} and "expandable_segments:True" in ALLOCATOR
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    allocator_default(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}


def test_one_gpu_settings_place_both_roles_on_gpu_0_and_the_command_line_wins(capsys):
    from cli.run import one_gpu

    over = one_gpu(["--learner.micro_batch_tokens", "8192", "--actor.kv_cache_gib=12"])
    printed = capsys.readouterr().out
    assert "transport.weight_backend=\"ipc\"" in printed and "micro_batch_tokens" not in printed
    c = load_config("brorl-1.5b", {**over, "model.path": "m", "verifiers.task": "arith"})
    assert (c.learner.micro_batch_tokens, c.actor.kv_cache_gib, c.learner.backend) == (8192, 12, "torch")
    assert c.learner.packing and c.learner.compile  # compiled packed passes, the fastest measured on spread lengths
    p = place(c, visible=1)
    assert p == Placement([0], [[0]])
