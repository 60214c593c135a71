"""Transport: everything that crosses between actors and learner.

Lives here: wire types, ZeroMQ sockets (work dispatch, rollout stream, control plane) and the weight
broadcast (NCCL on GPUs, gloo on CPUs).
Must not import: any other brorl package (`config` included) — transport moves typed messages and tensors
and knows nothing of what they mean.
"""
