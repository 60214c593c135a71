"""The weight group: a torch process group of its own (TCPStore rendezvous + gloo or NCCL) between the
learner's rank 0 and every receiving vLLM worker, and letting go of one."""

from __future__ import annotations

import datetime

from transport.ports import route_to


def open_group(host: str, port: int, rank: int, world_size: int, group_name: str, timeout_s: float,
               backend: str = "gloo"):
    """A process group of its own (not the default one): TCPStore rendezvous + gloo (or NCCL). Rank 0's
    store listens on `host` only (TCPStore by itself would listen on every interface). gloo's transfers use
    the address each rank reaches the others by: `host` on rank 0, on the others their own address on the
    route to it. (gloo by itself takes the address this machine's hostname resolves to, which on a host
    with several networks need not be the one the learner can reach: the transfers then fail.)"""
    import socket

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    listen = None
    if rank == 0:
        listen = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listen.bind((host, port))
        listen.listen(1024)
    store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False,
                          master_listen_fd=None if listen is None else listen.detach())  # the store owns it now
    prefixed = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host if rank == 0 else route_to(host, port))]
        return dist.ProcessGroupGloo(prefixed, rank, world_size, opts), store
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(prefixed, rank, world_size, opts), store


def release_group(pg) -> None:
    """Let go of a weight group now. An NCCL communicator is aborted: left to its destructor, it would wait
    for its kernels, and a broadcast stuck on a receiver that died never ends (the process then hangs at
    exit). gloo needs nothing."""
    if pg is not None and "NCCL" in type(pg).__name__:
        try:
            pg.abort()
        except Exception:  # already aborted by its watchdog
            pass
