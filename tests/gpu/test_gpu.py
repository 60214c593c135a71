"""CUDA tests: deselected where no GPU exists (tests/conftest.py); run on the GPU machine with
`pytest tests/gpu` (vLLM for CUDA installed, 2 GPUs for the NCCL test)."""

import pytest
import torch

from config.loader import load_config
from config.schema import JobConfig, LearnerConfig
from learner.train_step import Trainer
from tests.support.train_fixtures import fixed_groups


@pytest.mark.gpu
def test_train_step_on_cuda_matches_cpu(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    groups, eos = fixed_groups(tiny_model_dir)
    out = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        cfg = LearnerConfig(num_minibatches=2, lr=1e-3, device=device,
                            logprob_chunk_mb=0.01)
        tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)), pad_id=eos)
        losses = [tr.step(groups)["loss"] for _ in range(2)]
        out[device] = (losses, {k: v.detach().cpu() for k, v in tr.model.state_dict().items()})
    assert out["cuda"][0] == pytest.approx(out["cpu"][0], rel=1e-3, abs=1e-5)
    for k, v in out["cpu"][1].items():
        torch.testing.assert_close(out["cuda"][1][k], v, rtol=1e-3, atol=1e-4, msg=k)


@pytest.mark.gpu
def test_vllm_cuda_logprobs_and_nccl_weight_broadcast(tiny_model_dir):
    """vLLM (CUDA) on GPU 0, the learner's NCCL rank on GPU 1: behaviour log-probs match transformers,
    and a broadcast of new weights lands (checksum, version, greedy output of the new weights)."""
    assert torch.cuda.device_count() >= 2, "this test needs 2 GPUs (NCCL allows one rank per GPU)"
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    from actors.engine import engine_kwargs, offline_env, sampling_params
    from tests.support.vllm_weights import behaviour_gap, broadcast_into

    offline_env()
    cfg = load_config("tiny-cpu", {"model.path": tiny_model_dir, "actor.gpu_memory_utilization": 0.3, "actor.kv_cache_gib": 0,
                                   "transport.weight_backend": "nccl"})
    llm = LLM(**engine_kwargs(cfg.model, cfg.actor, weight_backend="nccl"))
    learner_dev = torch.device("cuda:1")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(learner_dev).eval()

    def behaviour_error(m):
        gap = behaviour_gap(llm, m, ["3+4=", "12-5="], sampling_params(cfg.actor, n=8, max_tokens=8), learner_dev)
        return gap.abs().max().item()

    # CUDA kernels differ from torch's in reduction order (and vLLM may use TF32): a few 1e-3 per token
    # at most; a policy that is not the one sampled from is off by far more (checked below)
    assert behaviour_error(model) < 2e-2
    import copy

    old = copy.deepcopy(model)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)

    sent, (version, checksum) = broadcast_into(llm, model, "nccl", device=learner_dev)
    assert (version, checksum) == (1, sent)
    err_new, err_old = behaviour_error(model), behaviour_error(old)
    assert err_new < 5e-2 and err_old > 10 * err_new, (err_new, err_old)  # it samples from the new weights


@pytest.mark.gpu
def test_two_nccl_learner_ranks_match_one_rank(tiny_model_dir, tmp_path):
    """The service's rank protocol on 2 GPUs (DeepSpeed ZeRO-2 over NCCL, rank 0 handing rank 1 its share)
    gives the single-process step's losses and weights."""
    from transformers import AutoModelForCausalLM

    from tests.integration.test_train_step import _run_worker

    assert torch.cuda.device_count() >= 2, "this test needs 2 GPUs"
    ref_m, ref_w = _run_worker(tiny_model_dir, tmp_path / "one", "torch", 1, device="cuda")
    m, w = _run_worker(tiny_model_dir, tmp_path / "two", "deepspeed-ranks", 2, micro_batch_tokens=40, device="cuda")
    assert m["world"] == 2
    assert m["losses"] == pytest.approx(ref_m["losses"], rel=1e-3, abs=1e-5)
    init = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    diff = update = 0.0
    for k, v in ref_w.items():
        diff += (w[k] - v).float().pow(2).sum().item()
        update += (v - init[k]).float().pow(2).sum().item()
    assert update > 0 and (diff / update) ** 0.5 < 1e-2, (diff / update) ** 0.5


@pytest.mark.gpu
async def test_brorl_learner_on_two_gpus_trains_checkpoints_and_resumes(tiny_model_dir, tmp_path):
    """`brorl learner` with learner.devices = 2 on CUDA (NCCL between the ranks) against FakeActors."""
    from tests.integration.test_learner_ranks import test_two_learner_ranks_train_checkpoint_and_resume as run

    assert torch.cuda.device_count() >= 2, "this test needs 2 GPUs"
    await run(tiny_model_dir, tmp_path, 2, device="cuda")


@pytest.mark.gpu
def test_shared_prompt_in_bf16_on_cuda_matches_unshared(tiny_model_dir):
    """The shared prompt on CUDA under bf16 autocast (flash/efficient attention kernels): log-probs within
    bf16 noise of the unshared computation."""
    from transformers import AutoModelForCausalLM

    from learner.logprobs import pack, token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda()
    g = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    prompt = torch.randint(0, vocab, (12,), generator=g).tolist()
    comps = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (7, 1, 4, 7)]
    out = []
    for share in (False, True):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lp, _ = token_logprobs(model, pack([prompt] * 4, comps, device="cuda", share_prompt=share))
        out.append(lp.float().cpu())
    assert (out[0] - out[1]).abs().max().item() < 0.05
