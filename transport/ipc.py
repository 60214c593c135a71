"""The learner's persistent weight buffer, shared with the vLLM workers of actors on the same host
(`transport.weight_backend = "ipc"`): the data plane of a weight update that never leaves the device.

The learner allocates one flat uint8 buffer holding every bucket of the weight plan (in the serving dtype,
each bucket at the sum of the sizes before it), once, and hands each receiving worker a handle to it at
the rendezvous; every update is then a device copy into it on the learner and a device copy out of it on
each worker (`transport.weights`). A handle is plain JSON (it travels in the control message of the
rendezvous; nothing is unpickled):

- CUDA: a CUDA IPC handle of the buffer (`torch.multiprocessing.reductions.reduce_tensor`'s arguments,
  bytes as base64), keyed by the GPU's UUID: a worker opens it on whichever of its devices has that UUID.
  One handle per receiving rank (each carries its own reference count on the learner's allocation).
- CPU: a named POSIX shared-memory segment (`multiprocessing.shared_memory`, created by the learner).
  Workers map it without registering it with multiprocessing's resource tracker, which on Python
  3.11/3.12 would unlink the learner's segment when a worker exits.

Every handle names the host's boot id: a worker on another machine is refused with a one-line error
instead of mapping nothing.
"""

from __future__ import annotations

import base64
import datetime
import mmap
import os
import time
import uuid
import weakref
from typing import Any, Callable

import torch

SETTING = 'transport.weight_backend = "ipc"'


class IpcError(RuntimeError):
    """A shared weight buffer cannot be made or opened here (another host, another GPU, a gone segment)."""


def boot_id() -> str:
    """This machine's kernel boot id (one per host, shared by its containers); the hostname elsewhere."""
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        import socket

        return socket.gethostname()


def is_local_address(host: str) -> bool:
    """Is `host` (a name or an address) one of this machine's own addresses? (A socket binds only there.)"""
    import socket

    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return True
            except OSError:
                continue
    return False


def remote_learner(weight_backend: str, learner_host: str) -> str:
    """Why an actor may not start with this backend against a learner at `learner_host` ("" when it may):
    ipc maps the learner's memory, so the learner must be on this host."""
    if weight_backend != "ipc" or is_local_address(learner_host):
        return ""
    return (f"{SETTING} needs the learner on this host, and its address {learner_host} is not one of this "
            f"machine's: set transport.weight_backend = \"nccl\" (GPUs) or \"gloo\"")


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


class SharedBuffer:
    """Learner side: a flat uint8 buffer of `nbytes` on `device`, shareable with local processes."""

    def __init__(self, nbytes: int, device: torch.device | str):
        self.device = torch.device(device)
        self.nbytes = max(1, int(nbytes))
        self._shm = None
        if self.device.type == "cuda":
            self.tensor = _cuda_buffer(self.nbytes, self.device)
            self.uuid = str(torch.cuda.get_device_properties(self.device).uuid)
        elif self.device.type == "cpu":
            from multiprocessing import shared_memory

            self._shm = shared_memory.SharedMemory(name=f"brorl-{uuid.uuid4().hex[:16]}", create=True,
                                                   size=self.nbytes)
            self.tensor = torch.frombuffer(self._shm.buf, dtype=torch.uint8, count=self.nbytes)
            # unlinked when this object goes (or at exit): a worker that mapped it keeps its mapping
            self._finalizer = weakref.finalize(self, _unlink, self._shm)
        else:
            raise IpcError(f"{SETTING}: no shared buffer on a {self.device.type} device (CUDA or CPU only)")

    def handle(self) -> dict[str, Any]:
        """A handle for one receiving process (JSON)."""
        if self._shm is not None:
            return {"kind": "shm", "name": self._shm.name, "nbytes": self.nbytes, "boot_id": boot_id()}
        from torch.multiprocessing.reductions import reduce_tensor

        _, args = reduce_tensor(self.tensor)
        args = list(args)
        return {"kind": "cuda", "uuid": self.uuid, "nbytes": self.nbytes, "boot_id": boot_id(),
                "storage_cls": args[4].__name__, "size": list(args[1]), "stride": list(args[2]),
                "tensor_offset": int(args[3]), "handle": _b64(args[7]), "storage_size_bytes": int(args[8]),
                "storage_offset_bytes": int(args[9]), "ref_counter_handle": _b64(args[11]),
                "ref_counter_offset": int(args[12]), "event_handle": _b64(args[13]),
                "event_sync_required": bool(args[14])}

    def close(self) -> None:
        """Let go of the buffer (a worker that still maps it keeps its mapping until it lets go too)."""
        self.tensor = None
        if self._shm is not None:
            try:
                self._shm.close()
            except BufferError:  # a view of it is still alive somewhere: the mapping goes with it
                pass
            self._finalizer()
            self._shm = None


def _unlink(shm) -> None:
    try:
        shm.unlink()  # (and out of this process's resource tracker, where creating it put it)
    except FileNotFoundError:
        pass


def _cuda_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """A buffer from a plain cudaMalloc segment: with expandable segments (the learner's allocator setting)
    a CUDA IPC handle would need a file-descriptor exchange between the processes instead."""
    expandable = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
    setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if expandable and setter is not None:
        setter("expandable_segments:False")
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    finally:
        if expandable and setter is not None:
            setter("expandable_segments:True")


class OpenedBuffer:
    """Worker side: the learner's buffer mapped into this process, as a uint8 tensor."""

    def __init__(self, handle: dict[str, Any]):
        if handle.get("boot_id") != boot_id():
            raise IpcError(f"{SETTING} needs the learner and its actors on one host; this worker runs on another: "
                           f"set transport.weight_backend to \"nccl\" (GPUs) or \"gloo\"")
        self.handle = handle
        self._mmap = None
        if handle["kind"] == "shm":
            self.tensor = self._open_shm(handle["name"], int(handle["nbytes"]))
        elif handle["kind"] == "cuda":
            self.tensor = _open_cuda(handle)
        else:
            raise IpcError(f"{SETTING}: unknown buffer kind {handle['kind']!r}")

    def _open_shm(self, name: str, nbytes: int) -> torch.Tensor:
        try:
            from _posixshmem import shm_open

            fd = shm_open("/" + name, os.O_RDWR, mode=0o600)
        except ImportError:  # no POSIX shared memory module: Linux keeps the segments here
            fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
        except FileNotFoundError:
            raise IpcError(f"{SETTING}: the learner's shared weight buffer {name!r} does not exist here (another "
                           f"host or container without a shared /dev/shm?): set transport.weight_backend to "
                           f"\"gloo\" or share /dev/shm") from None
        try:
            self._mmap = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        return torch.frombuffer(self._mmap, dtype=torch.uint8, count=nbytes)

    def close(self) -> None:
        self.tensor = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:  # a view of it is still alive: the mapping goes with it
                pass
            self._mmap = None


def _open_cuda(h: dict[str, Any]) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    local = {str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())}
    if h["uuid"] not in local:
        raise IpcError(f"{SETTING}: the learner's weight buffer is on GPU {h['uuid']}, which this vLLM worker does "
                       f"not see (it sees {sorted(local) or 'none'}): ipc needs the learner's GPU visible to the "
                       f"actor (a shared GPU); set transport.weight_backend = \"nccl\"")
    storage_cls = {"TypedStorage": torch.storage.TypedStorage, "UntypedStorage": torch.UntypedStorage}[h["storage_cls"]]
    return rebuild_cuda_tensor(torch.Tensor, torch.Size(h["size"]), tuple(h["stride"]), h["tensor_offset"],
                               storage_cls, torch.uint8, local[h["uuid"]], _unb64(h["handle"]),
                               h["storage_size_bytes"], h["storage_offset_bytes"], False,
                               _unb64(h["ref_counter_handle"]), h["ref_counter_offset"], _unb64(h["event_handle"]),
                               h["event_sync_required"])


# ---------------------------------------------------------------- the protocol over a weight group (gloo)
TAG_GO, TAG_ACK = 1, 2  # "the buffer holds version v" to each receiver, and its answer


def bucket_offsets(plan) -> list[int]:
    """Where each bucket of a `WeightPlan` starts in the shared buffer: the buckets laid end to end, in order."""
    out, off = [], 0
    for *_, n in plan.buckets:
        out.append(off)
        off += n
    return out


def send_shared(pg, buf: torch.Tensor, plan, bucket_tensors, dtype, version: int, world_size: int,
                timeout_s: float) -> tuple[str, set[int], dict[str, float]]:
    """Learner side of one update: pack every bucket into the shared buffer `buf` (a device copy; ZeRO-3's
    `bucket_tensors` gathers one bucket at a time), tell each rank of `pg` that it holds `version`, and wait
    (one `timeout_s` for all) until every one acknowledges having loaded it, or failing to: only then may the
    buffer be written again. Returns (checksum, the ranks that did not acknowledge, the time split)."""
    from transport.checksum import bucket_checksum_tensor, checksum_values, combine_checksums
    from transport.weights import pack_bucket

    t0, sums = time.perf_counter(), []
    for (a, b, n), off in zip(plan.buckets, bucket_offsets(plan)):
        with bucket_tensors(a, b) as tensors:
            flat = pack_bucket(tensors, n, buf.device, dtype, out=buf[off: off + n])
        sums.append(bucket_checksum_tensor(flat))
    checksum = combine_checksums(checksum_values(sums))  # reads the device: the packing is done
    if buf.is_cuda:
        torch.cuda.synchronize(buf.device)
    t1 = time.perf_counter()
    go = torch.tensor([version, 1], dtype=torch.int64)
    failed, pending = set(), {}
    for dst in range(1, world_size):
        ack = torch.zeros(2, dtype=torch.int64)
        try:
            pending[dst] = (ack, pg.send([go], dst, TAG_GO), pg.recv([ack], dst, TAG_ACK))
        except Exception:
            failed.add(dst)
    deadline = t1 + timeout_s  # a silent receiver costs the timeout once, not once per receiver
    for dst, (ack, sent, got) in pending.items():
        try:
            for work in (sent, got):
                work.wait(datetime.timedelta(seconds=max(0.001, deadline - time.perf_counter())))
            if ack.tolist() != [version, 1]:
                failed.add(dst)
        except Exception:
            failed.add(dst)
    return checksum, failed, {"pack_s": t1 - t0, "checksum_s": 0.0, "wait_s": time.perf_counter() - t1}


def await_shared(pg, version: int) -> None:
    """Receiver side, first: wait (within the group's timeout) for the learner's word that the shared buffer
    holds `version`."""
    go = torch.zeros(2, dtype=torch.int64)
    pg.recv([go], 0, TAG_GO).wait()
    if int(go[0]) != version:
        raise IpcError(f"the learner's shared buffer holds version {int(go[0])}, this update is {version}")


def read_shared(buf: torch.Tensor, plan, load: Callable[[torch.Tensor, int, int], None] | None = None) -> str:
    """Then: checksum each bucket as it stands in the shared buffer `buf` and hand it to `load(flat, first,
    last)` (views of the buffer: the learner does not write it again before this receiver's `acknowledge`).
    Returns the update's checksum."""
    from transport.checksum import bucket_checksum_tensor, checksum_values, combine_checksums

    sums = []
    for (first, last, n), off in zip(plan.buckets, bucket_offsets(plan)):
        flat = buf[off: off + n]
        sums.append(bucket_checksum_tensor(flat))
        if load is not None:
            load(flat, first, last)
    return combine_checksums(checksum_values(sums))


def acknowledge(pg, version: int, ok: bool) -> None:
    """Tell the learner this receiver is done with the shared buffer for `version` (loaded, or failed)."""
    pg.send([torch.tensor([version, int(ok)], dtype=torch.int64)], 0, TAG_ACK).wait()
