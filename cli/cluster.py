"""`brorl run --cluster ADDRESS|auto|local`: the same job with its roles placed by Ray.

Each role (the learner, every actor) runs in a Ray actor, `RoleHost`, that asks Ray for the role's
resources (CPUs; GPUs as the device placement counts them: the learner's `learner.devices`, an actor's
`actor.tensor_parallel_size`) and starts the role's own command (`python -m cli learner|actor …`, as
`docker run IMAGE …` would) as its child. The data plane does not change: ZeroMQ between the roles,
gloo/NCCL for weights. Ray only places, restarts and carries logs:

  - the config travels as text and is written to the run folder on whichever node a role lands;
  - Ray sets each GPU role's `CUDA_VISIBLE_DEVICES`; CPU actors that land on one node split its cores (each
    claims a slot there and binds its engine to the slot's share; the slots a node has are what its Ray
    custom resources allow of `run.ray_actor_resources`, else `actor.num_actors`), as on one host;
  - an actor whose process dies (or whose host is killed) is restarted by Ray (`max_restarts` =
    `run.max_actor_restarts`): a new incarnation that rejoins and gets the current weights before it
    takes work. An actor that refuses to start (a verifier failed its self-test) is not restarted and
    stops the job, as on one machine. A learner that dies is restarted by the driver, as on one machine
    (`run.max_learner_restarts`): a new host with `--resume`, which waits on its node for the old learner's
    ports to be free; whether the dead one had served and its checkpoint's step come from its host;
  - each role's output goes to `run_dir/logs/<role>.log` on its node and is streamed to the driver
    (`[actor-0] …` lines); its events (`transport/events.py`) go to `run_dir/events.jsonl` on its node, which
    the driver tails as on one machine where the run folder is the driver's (one node, or a shared file
    system); elsewhere only the streamed log lines carry them;
  - stopping is the single-machine order (SIGTERM the learner, which checkpoints and tells the actors
    to stop; then the actors), through the hosts; then the hosts are killed and the driver disconnects.

The learner's endpoints: roles connect to `transport.host`, so on several nodes it must be the learner
node's address (and CURVE on, with the keys present on every node: `brorl keys`); on one node the
loopback default works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from actors.verifier_set import EXIT_REFUSED
from cli.launcher import PORTS_FREE_S, Launcher
from cli.learner_restart import checkpoint_step, ledger_size, served_since, wait_ports_free
from cli.procs import die_with_parent, kill_group
from config.schema import BrorlConfig


def _role_preexec() -> None:
    """In the role's process before it starts: die with its host, and run at the node's normal priority.
    Ray starts its workers at nice 15 to keep its own daemons responsive; a role inheriting that would lose
    the CPU to any ordinary process on the node. Lowering nice needs CAP_SYS_NICE (root in a container has
    it); without it the role stays where Ray put it (the host says so)."""
    die_with_parent()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except PermissionError:
        pass


def claim_core_slot(key: str, capacity: int, folder: str | None = None) -> tuple[int, object] | None:
    """The lowest free one of `capacity` CPU slots on this node for job `key`: a lock file
    (`<tmp>/brorl-cores-<key>/slot-<k>`, flock) held while the returned file object stays open, so a slot
    is free again the moment its holder dies (a restarted actor takes one afresh). None: all taken."""
    import fcntl
    import tempfile

    d = Path(folder or tempfile.gettempdir()) / f"brorl-cores-{key}"
    d.mkdir(parents=True, exist_ok=True)
    for k in range(capacity):
        f = open(d / f"slot-{k}", "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        return k, f
    return None


def node_actor_capacity(per_actor: dict[str, float], node_resources: dict[str, float], num_actors: int) -> int:
    """How many CPU actors this node may hold: what its Ray custom resources allow (the least of
    total // per actor over `run.ray_actor_resources`), else the job's `actor.num_actors`."""
    fits = [int(node_resources.get(k, 0.0) // v) for k, v in per_actor.items() if v > 0]
    return max(1, min([num_actors, *fits]))


class RoleHost:
    """A Ray actor holding one role's process (decorated with `ray.remote` when the launcher starts)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], run_dir: str, config_toml: str,
                 restartable: bool, core_share: dict | None = None):
        run = Path(run_dir)
        (run / "logs").mkdir(parents=True, exist_ok=True)
        cfg_path = run / "config.toml"
        if not cfg_path.exists() or cfg_path.read_text() != config_toml:
            cfg_path.write_text(config_toml)  # another node: the role reads the job's config from here
        self.name, self.restartable, self.stopping = name, restartable, False
        import ray

        # this node's address as Ray knows it: vLLM's own guess (the route to a public address) fails on a node
        # with no default route, and on a node with several networks may pick one the others cannot reach
        self.node_ip = ray.util.get_node_ip_address()
        env = {"VLLM_HOST_IP": self.node_ip, **env} if "VLLM_HOST_IP" not in os.environ else env
        if core_share and "VLLM_CPU_OMP_THREADS_BIND" not in {**os.environ, **env}:
            env = {**env, **self._bind_cores(name, core_share)}
        self.run_dir, self.ledger_mark = run, ledger_size(run)
        if name == "learner" and "--resume" in args:  # a restart: the dead learner's ranks may hold its ports
            self._wait_ports(config_toml)
        from transport.events import role_env  # its events: on the driver's console where run_dir is shared

        env = {**env, **role_env((run / "events.jsonl").resolve(), name)}
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                                     start_new_session=True, preexec_fn=_role_preexec)
        self.log = run / "logs" / f"{name}.log"
        threading.Thread(target=self._pump, daemon=True).start()
        nice = os.getpriority(os.PRIO_PROCESS, self.proc.pid)
        if nice > 0:
            print(f"[{name}] runs at nice {nice}, the priority Ray gives its workers (lowering it needs "
                  f"CAP_SYS_NICE): other work on this node comes first", flush=True)

    def _wait_ports(self, config_toml: str) -> None:
        import tomllib

        t = tomllib.loads(config_toml).get("transport", {})
        busy = wait_ports_free(t.get("host", "127.0.0.1"), tuple(t.get(k, 0) for k in
                               ("work_port", "rollout_port", "control_port")), PORTS_FREE_S)
        if busy:
            print(f"[{self.name}] ports {busy} still in use after {PORTS_FREE_S:.0f} s; starting anyway", flush=True)

    def _bind_cores(self, name: str, share: dict) -> dict[str, str]:
        """A CPU actor on a node of a cluster: vLLM's automatic binding would put every engine on this node on
        the same first core, so the actors that land here split its cores: each claims a slot on the node and
        binds its engine to that slot's share (`cpu_cores`)."""
        import ray

        from config.placement import cpu_cores

        me = ray.get_runtime_context().get_node_id()
        total = next((n.get("Resources", {}) for n in ray.nodes() if n.get("NodeID") == me), {})
        capacity = node_actor_capacity(share["per_actor"], total, share["num_actors"])
        if capacity < 2:
            return {}  # the only CPU actor this node holds: vLLM's own binding takes its cores
        claimed = claim_core_slot(share["key"], capacity)
        if claimed is None:
            print(f"[{name}] WARNING: all {capacity} CPU slots of this node are taken (more actors here than its "
                  f"Ray resources allow?): its engine keeps vLLM's own binding and shares a core", flush=True)
            return {}
        slot, self._slot_lock = claimed
        cores = cpu_cores(slot, capacity, sorted(os.sched_getaffinity(0)))
        print(f"[{name}] binds its engine to cores {cores} (slot {slot} of {capacity} CPU actors this node "
              f"may hold)", flush=True)
        return {"VLLM_CPU_OMP_THREADS_BIND": cores} if cores else {}

    def _pump(self) -> None:
        """The role's output into its log file and, line by line, to this worker's stdout (Ray streams it to
        the driver); when the role dies unasked and may be restarted, this host dies too, so Ray restarts it."""
        with open(self.log, "ab") as f:
            for line in iter(self.proc.stdout.readline, b""):
                f.write(line)
                f.flush()
                print(f"[{self.name}] {line.decode(errors='replace').rstrip()}", flush=True)
        rc = self.proc.wait()
        if rc not in (0, EXIT_REFUSED) and self.restartable and not self.stopping:
            print(f"[{self.name}] exited with {rc}; Ray restarts it", flush=True)
            os._exit(1)

    def status(self) -> dict:
        rc = self.proc.poll()
        st = {"host_pid": os.getpid(), "pid": self.proc.pid, "rc": rc, "node_ip": self.node_ip}
        if rc is not None and self.name == "learner":  # what the driver's restart policy needs, from this node
            st.update(served=served_since(self.run_dir, self.ledger_mark), checkpoint=checkpoint_step(self.run_dir))
        return st

    def signal(self, signum: int) -> None:
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def kill_group(self) -> None:
        self.stopping = True
        kill_group(self.proc.pid)


class RayRole:
    """The launcher's handle on a `RoleHost`: what it uses of `subprocess.Popen` (poll, wait, send_signal,
    kill, pid, returncode), answered through Ray. `restarts` counts the host incarnations Ray made."""

    def __init__(self, name: str, host):
        self.name, self.host = name, host
        self.returncode: int | None = None
        self.pid: int | None = None  # the role's pid on its node
        self.host_pid: int | None = None
        self.node_ip: str | None = None  # the node it runs on
        self.restarts = 0
        self.served, self.checkpoint = False, None  # a learner's, once it has exited (`RoleHost.status`)

    def poll(self) -> int | None:
        import ray

        if self.returncode is not None:
            return self.returncode
        try:
            st = ray.get(self.host.status.remote(), timeout=30)
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            return None  # being restarted by Ray, or busy: alive as far as we know
        except ray.exceptions.ActorDiedError:  # dead for good (restarts used up, or killed; a learner: restarted)
            self.returncode = -signal.SIGKILL if self.name == "learner" else 1
            return self.returncode
        if self.host_pid is not None and st["host_pid"] != self.host_pid:
            self.restarts += 1
        self.host_pid, self.pid, self.returncode, self.node_ip = st["host_pid"], st["pid"], st["rc"], st["node_ip"]
        self.served, self.checkpoint = st.get("served", False), st.get("checkpoint")
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.2)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        import ray

        try:
            ray.get(self.host.signal.remote(int(signum)), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass

    def kill(self) -> None:
        import ray

        try:
            ray.get(self.host.kill_group.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        ray.kill(self.host, no_restart=True)
        if self.returncode is None:
            self.returncode = -signal.SIGKILL


def missing_resources(cfg: BrorlConfig, offered: dict[str, float]) -> None:
    """Refuse (ConfigError naming the field) a job asking for Ray custom resources that the cluster does not
    offer in the amounts its roles need: Ray would keep those roles pending, and the job would never start."""
    from config.loader import ConfigError

    run = cfg.run
    need: dict[str, list] = {}
    for field, per_role, roles in (("run.ray_learner_resources", run.ray_learner_resources, 1),
                                   ("run.ray_actor_resources", run.ray_actor_resources, cfg.actor.num_actors)):
        for k, amount in per_role.items():
            need.setdefault(k, [0.0, []])
            need[k][0] += amount * roles
            need[k][1].append(field)
    short = {k: (total, fields) for k, (total, fields) in need.items() if offered.get(k, 0.0) < total}
    if short:
        raise ConfigError("; ".join(
            f"{' and '.join(fields)} ask for {total:g} of Ray resource {k!r} in all, and the cluster offers "
            f"{offered.get(k, 0.0):g} (give nodes `ray start --resources '{{\"{k}\": N}}'`)"
            for k, (total, fields) in short.items()))


class RayLauncher(Launcher):
    """`Launcher` with each role in a Ray actor (see the module docstring)."""

    def __init__(self, cfg: BrorlConfig, address: str, resume: bool = False, quiet: bool = False):
        import ray

        if address == "local":  # a Ray instance of this process's own, for one machine
            ray.init(include_dashboard=False, log_to_driver=True)
        else:
            ray.init(address=address, log_to_driver=True)
        self._ray_remote = ray.remote(RoleHost)
        self._nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        offered = ray.cluster_resources()
        missing_resources(cfg, offered)
        super().__init__(cfg, resume=resume, quiet=quiet, gpus=int(offered.get("GPU", 0)))

    def device_env(self, name: str) -> dict[str, str]:
        """Ray sets CUDA_VISIBLE_DEVICES for the GPUs it grants the role's host. CPU actors' cores are split as on
        one host (`Launcher.device_env`) when the cluster is this one host; on several, each actor's host splits
        its node's cores with the actors that land there (`_core_share`)."""
        if self.placement.actors or name == "learner" or self._nodes > 1:
            return {}
        return super().device_env(name)

    def _core_share(self, name: str) -> dict | None:
        """For a CPU actor on a cluster of several nodes: what its host needs to split its node's cores with the
        other actors there (`RoleHost._bind_cores`). None where `device_env` binds it already, or a GPU does."""
        if name == "learner" or self.placement.actors or self._nodes <= 1:
            return None
        import hashlib

        key = hashlib.sha1(str(Path(self.run_dir).resolve()).encode()).hexdigest()[:12]
        return {"key": key, "num_actors": self.cfg.actor.num_actors,
                "per_actor": dict(self.cfg.run.ray_actor_resources)}

    def _gpus_of(self, name: str) -> int:
        p = self.placement
        if name == "learner":
            return len(p.learner)
        return len(p.actors[int(name.rsplit("-", 1)[1])]) if p.actors else 0

    def _start(self, name: str, args: list[str]) -> RayRole:
        from config.loader import to_toml

        learner = name == "learner"
        extra = self.cfg.run.ray_learner_resources if learner else self.cfg.run.ray_actor_resources
        host = self._ray_remote.options(
            num_cpus=1, num_gpus=self._gpus_of(name), resources=dict(extra) or None,
            max_restarts=0 if learner else self.cfg.run.max_actor_restarts,
            max_task_retries=0, max_concurrency=4,  # status and signals answer while the pump runs
        ).remote(name, args, self.device_env(name), str(self.run_dir), to_toml(self.cfg), not learner,
                 self._core_share(name))
        p = RayRole(name, host)
        self.procs[name] = p
        self._started_at[name] = time.monotonic()
        return p

    def _supervise_actors(self) -> None:
        """Ray restarts dead actors; here: count the restarts, and stop on a refusal or a host given up."""
        for name, p in self.procs.items():
            if name == "learner" or name in self.given_up:
                continue
            rc = p.poll()
            if rc == EXIT_REFUSED:
                self._tail_events()  # its reason, where the run folder is shared with the driver
                self.refused = f"{name} refused to start" + ("" if name in self.fatal_of else
                                                             f": see {self.logs / f'{name}.log'}")
                self._say(f"[brorl run] {self.refused}; stopping the job")
                return
            if rc is not None:
                self.given_up.append(name)
                print(f"[brorl run] {name} exited with {rc} (Ray restarts used up: run.max_actor_restarts); "
                      f"leaving it down", flush=True)
        self.restarts = sum(p.restarts for n, p in self.procs.items() if n != "learner")

    def _reap(self, p) -> None:
        p.kill()

    def _learner_served(self) -> bool:
        return self.procs["learner"].served

    def _checkpoint_step(self) -> int | None:
        """From the learner's node (its host's status); the driver's view of the run folder if that host is gone."""
        step = self.procs["learner"].checkpoint
        return step if step is not None else super()._checkpoint_step()

    def _wait_learner_ports(self) -> None:
        """The new learner's host waits on its own node (`RoleHost._wait_ports`)."""

    def close(self) -> None:
        import ray

        for p in self.procs.values():
            p.kill()
        ray.shutdown()
