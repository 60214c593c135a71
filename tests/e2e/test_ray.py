"""`brorl run --cluster`: the tiny job on a real Ray cluster of two nodes that meet over a network only (`ray
start`, its own GCS, raylets and workers; the second node in a network namespace joined by a veth pair), each
role in a Ray actor: the learner on one node, two actors on the other, splitting its cores. One actor's Ray
host is SIGKILLed mid-run: Ray restarts it, the new incarnation rejoins and its groups are trained, and the
ledger shows no prompt lost or trained twice."""

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from cli.cluster import RayLauncher
from learner.ledger import account, check
from tests.support.faults import granted_to, job, nice, steps_done, working
from transport.ports import RAY_WORKER_PORTS as WORKER_PORTS, free_port, free_ports

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
# The test clusters' Ray workers listen on Ray's default ports (`ray start` refuses a head port among them, and a
# job's port there could be taken by a worker): free_port never picks one, here or in any test beside this one.


def job_ports(host: str = "127.0.0.1") -> dict:
    """The job's work, rollout and control ports (free_ports keeps them out of `WORKER_PORTS`)."""
    port = free_ports(3, host)
    return {"transport.work_port": port, "transport.rollout_port": port + 1, "transport.control_port": port + 2}


def _ray_start(cmd: list[str]) -> list[int]:
    """Run a `ray start` command (workers on Ray's default ports, a small object store, no usage stats); the
    pids of the Ray processes it left running (not whatever else started meanwhile)."""
    before = set(psutil.pids())
    r = subprocess.run([*cmd, "--object-store-memory=100000000", "--disable-usage-stats",
                        f"--min-worker-port={WORKER_PORTS[0]}", f"--max-worker-port={WORKER_PORTS[-1]}"],
                       env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, timeout=180, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-2000:]}"
    return [pid for pid in psutil.pids() if pid not in before and _is_ray(pid)]


def _stop(pids) -> None:
    """Terminate these processes and their descendants (killed after 10 s)."""
    ours = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            ours += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for p in ours:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(ours, timeout=10)
    for p in alive:
        p.kill()


def _is_ray(pid: int) -> bool:
    """A process of Ray's own: its daemons run from the ray package (a path in it, or `-m ray.…` like the client
    server), its workers are named ray::…."""
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    return "/ray/" in cmd or " -m ray." in cmd or cmd.startswith("ray::")


@pytest.fixture
def two_nodes(monkeypatch):
    """A Ray cluster of two nodes that reach each other over a network only: the head in this machine's
    network namespace, the second node in a network namespace of its own, joined to it by a veth pair
    (HEAD_IP ↔ NODE_IP). Roles on the second node reach the learner by its address, as on two hosts (the
    file system stays shared, as a cluster's shared storage would be). Needs root (CI runs as root).
    Stopped afterwards by the pids it started and their descendants; the namespace and its link removed."""
    x = 1 + os.getpid() % 250
    ns, link = f"brorl-t{os.getpid()}", f"vb{os.getpid() % 100000}"
    head_ip, node_ip = f"10.213.{x}.1", f"10.213.{x}.2"

    def sh(*cmd):
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    started: list[int] = []
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", f"{link}a", "type", "veth", "peer", "name", f"{link}b")
        sh("ip", "link", "set", f"{link}b", "netns", ns)
        sh("ip", "addr", "add", f"{head_ip}/30", "dev", f"{link}a")
        sh("ip", "link", "set", f"{link}a", "up")
        for cmd in (("ip", "addr", "add", f"{node_ip}/30", "dev", f"{link}b"), ("ip", "link", "set", f"{link}b", "up"),
                    ("ip", "link", "set", "lo", "up")):
            sh("ip", "netns", "exec", ns, *cmd)
        port = free_port(head_ip)
        started += _ray_start([*RAY, "start", "--head", f"--node-ip-address={head_ip}", f"--port={port}",
                               "--num-cpus=2", '--resources={"learner_node": 1}', "--include-dashboard=false"])
        started += _ray_start(["ip", "netns", "exec", ns, *RAY, "start", f"--address={head_ip}:{port}",
                               f"--node-ip-address={node_ip}", "--num-cpus=4", '--resources={"actor_node": 2}'])
        yield f"{head_ip}:{port}", head_ip, node_ip
    finally:
        _stop(started)
        subprocess.run(["ip", "link", "del", f"{link}a"], capture_output=True, timeout=60)  # and its peer
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)


def test_ray_places_the_roles_on_two_hosts_and_restarts_a_killed_actor(warm_model_dir, tmp_path, two_nodes):
    """The learner on the head (Ray resource `learner_node`), both actors on the other node (`actor_node`):
    the actors reach the learner's sockets (CURVE, as off loopback it must be), weight group and store over
    the veth link, by the learner's address. Once both work, actor-0's Ray host is SIGKILLed by pid: Ray
    restarts it on its node, the new incarnation rejoins, gets the current weights and its groups are trained;
    the job stops cleanly (SIGTERM, a checkpoint), with every group accounted for."""
    from transport.security import generate

    address, head_ip, node_ip = two_nodes
    run = tmp_path / "run"
    keys = generate(tmp_path / "keys", ["actor-0", "actor-1"], ["admin"])  # off loopback, CURVE is required
    # Ray's own processes share the 2 cores too: a 10 s heartbeat timeout keeps a busy actor from being evicted
    cfg = job(warm_model_dir, run, steps=100_000, actors=2, **{
        "transport.heartbeat_timeout_s": 10.0, "transport.host": head_ip, "transport.curve": True,
        "transport.keys_dir": str(keys), **job_ports(head_ip),
        "run.ray_learner_resources": {"learner_node": 1}, "run.ray_actor_resources": {"actor_node": 1}})
    la = RayLauncher(cfg, address, quiet=True)
    state: dict = {}
    try:
        la.start()
        assert la.placement.learner == [] and set(la.procs) == {"learner", "actor-0", "actor-1"}
        for p in la.procs.values():  # Ray's workers run at nice 15; the roles at the node's normal priority
            p.poll()
            assert os.getpriority(os.PRIO_PROCESS, p.pid) == 0, p.name
        end = time.monotonic() + 900
        while la.procs["learner"].poll() is None:  # both work; one is killed; its replacement works, 3 steps more
            assert time.monotonic() < end, (f"the job did not get there: {steps_done(run)} steps, {state}; "
                                            f"grants {[len(granted_to(run, a)) for a in ('actor-0', 'actor-1')]}\n"
                                            + "\n".join(f"{f.name}: {f.read_text()[-1500:]}"
                                                        for f in sorted((run / "logs").glob("*.log"))))
            la._supervise_actors()
            incs = {r["incarnation"] for r in granted_to(run, "actor-0")}
            if "both" not in state and working(run, "actor-0") and working(run, "actor-1"):
                state["both"] = steps_done(run)
                state["nodes"] = {name: p.node_ip for name, p in la.procs.items()}
            elif "both" in state and "killed" not in state and steps_done(run) >= state["both"] + 1:
                state["host"] = la.procs["actor-0"].host_pid
                os.kill(state["host"], signal.SIGKILL)  # the Ray actor itself, by pid
                state["killed"] = steps_done(run)
                # on 2 shared cores the job training flat out starves the replacement's engine start (minutes):
                # the survivors yield the CPU until it takes work (on their own hosts they would not compete)
                nice(la, ["learner", "actor-1"], 19)
            elif "killed" in state and len(incs) > 1 and "second" not in state:
                if "yielded" not in state:
                    nice(la, ["learner", "actor-1"], 0)
                    state["yielded"] = True
                grants = granted_to(run, "actor-0")  # actor-1 trains on meanwhile: wait for the replacement's own
                new = {pid for r in grants if r["incarnation"] != grants[0]["incarnation"] for pid in r["granted"]}
                if new & set(account(run).trained):
                    state["second"] = steps_done(run)
            elif "second" in state and steps_done(run) >= state["second"] + 3:
                break  # the replacement's groups trained and the job trained on
            time.sleep(0.5)
        nodes = {name: p.node_ip for name, p in la.procs.items()}
    finally:
        la.stop()
        la.close()
    assert la.procs["learner"].returncode == 0, (run / "logs" / "learner.log").read_text()[-3000:]
    assert "second" in state, f"the learner ended before the replacement trained: {state}"
    placed = {"learner": head_ip, "actor-0": node_ip, "actor-1": node_ip}
    assert state["nodes"] == placed and nodes == placed, (state, nodes)  # the replacement on the actors' node
    assert la.restarts == 1 and la.procs["actor-0"].host_pid != state["host"], state
    acc = account(run)
    check(acc, steps_done(run))  # every trained prompt once, every granted one trained, dropped or given back
    grants = granted_to(run, "actor-0")
    new = {pid for r in grants if r["incarnation"] != grants[0]["incarnation"] for pid in r["granted"]}
    assert new & set(acc.trained), "the restarted actor's groups were never trained"
    assert "[actor-0]" not in (run / "logs" / "actor-0.log").read_text()  # the file holds the role's own lines
    # the two actors share a node: each engine bound to its own share of its cores, not both to vLLM's first core
    cores = {a: re.findall(r"core ids=(\[[\d, ]*\])", (run / "logs" / f"{a}.log").read_text())
             for a in ("actor-0", "actor-1")}
    assert all(cores.values()) and not set(cores["actor-0"]) & set(cores["actor-1"]), cores
