"""A ShardedReplay on a two-node Ray cluster on this machine (loopback only), end to end.

Starts a head node and a second node with ``ray start`` on 127.0.0.1, then:

1. builds a 2-shard replay with detached, named shards (Ray spreads them, one per node);
2. two writer tasks add transitions while the learner samples and updates priorities;
3. checks the sampling law against the exact global ``p_i^alpha / sum p^alpha`` (chi-square);
4. SIGKILLs the shard on the second node mid-training, measures the time until the
   learner is sampling again and the rows lost (the loss window after the last durable point);
5. a second learner process reattaches to the running shards by name and continues;
6. stops the cluster.

    python examples/distributed_two_nodes.py   # about a minute; writes benchmarks/results/distributed-two-nodes.txt
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

RAY = str(Path(sys.executable).with_name("ray"))
HEAD_PORT = 6391
LOOPBACK = "127.0.0.1"
SCHEMA = {"id": ((), np.int64), "obs": ((4,), np.float32)}


OUTPUT = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "distributed-two-nodes.txt"
_lines: list[str] = []


def say(line: str, flush: bool = True) -> None:
    """Print a line of the run's report and keep it for OUTPUT."""
    print(line, flush=flush)
    _lines.append(line)


def ray_node(*args: str) -> subprocess.Popen:
    """A Ray node as a child process group of ours (``ray start --block``), so we stop exactly it.

    ``ray stop`` would stop every Ray process on the machine, other users' included.
    """
    cmd = [RAY, "start", "--block", "--node-ip-address", LOOPBACK, "--disable-usage-stats", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def stop(node: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if node.poll() is not None:
            return
        os.killpg(node.pid, sig)
        try:
            node.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def wait_for_head(address: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while subprocess.run([RAY, "status", "--address", address], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Ray head answered at {address} in {timeout} s")
        time.sleep(1)


def alive_nodes(ray: object, count: int, timeout: float = 120) -> list[dict]:
    """The cluster's nodes, once ``count`` of them are up."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = [n for n in ray.nodes() if n["Alive"]]  # type: ignore[attr-defined]
        if len(nodes) >= count:
            return nodes
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(nodes)} of {count} Ray nodes came up in {timeout} s")
        time.sleep(0.5)


def rows(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"id": ids.astype(np.int64), "obs": np.tile(ids[:, None], (1, 4)).astype(np.float32)}


def main() -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "token")  # every process of this cluster authenticates with the local token
    address = f"{LOOPBACK}:{HEAD_PORT}"
    say(f"starting a head node and a second node on {LOOPBACK}", flush=True)
    head = ray_node("--head", "--port", str(HEAD_PORT), "--num-cpus", "1", "--include-dashboard", "false",
                    "--resources", '{"node_a": 1}')  # fmt: skip
    nodes = [head]
    try:
        wait_for_head(address)
        nodes.append(ray_node("--address", address, "--num-cpus", "1", "--resources", '{"node_b": 1}'))
        run(address)
    finally:
        for node in reversed(nodes):
            stop(node)
        say("cluster stopped")
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        header = f"$ python examples/distributed_two_nodes.py   # {time.strftime('%Y-%m-%d %H:%M')}, git {revision}"
        OUTPUT.write_text("\n".join([header, *_lines]) + "\n")


def run(address: str) -> None:
    import ray
    from scipy import stats

    from hetero_replay.distributed import ShardedReplay

    ray.init(address=address, _node_ip_address=LOOPBACK, namespace="hetero_replay", log_to_driver=False)
    nodes = alive_nodes(ray, 2)
    # Ray replaces 127.0.0.1 by this machine's own interface address; packets to it stay on the host (routed via lo).
    say(f"cluster: {len(nodes)} nodes, addresses {sorted({n['NodeManagerAddress'] for n in nodes})} (this machine's)")
    durable_dir = tempfile.mkdtemp(prefix="hetero-replay-2nodes-")
    every = 500
    replay = ShardedReplay(
        2, 20_000, SCHEMA, alpha=1.0, eps=1e-6, seed=0, address=address, name="two-nodes", detached=True,
        durable_dir=durable_dir, flush_every=every, flush_seconds=3600,
        actor_options=[{"resources": {"node_a": 0.01}}, {"resources": {"node_b": 0.01}}],  # one shard per node
    )  # fmt: skip
    placement = ray.get(
        [h.__ray_call__.remote(lambda s: ray.get_runtime_context().get_node_id()) for h in replay._shards]
    )
    node_of = {n["NodeID"]: ("node_a" if n["Resources"].get("node_a") else "node_b") for n in nodes}
    say(f"shards on: {[node_of[p] for p in placement]}")

    # 2. writers (Ray tasks, one per node) add while the learner trains.
    @ray.remote(num_cpus=0)
    def write(writer: object, start: int, batches: int) -> int:
        for b in range(batches):
            writer.add(rows(np.arange(start + 50 * b, start + 50 * (b + 1))))  # type: ignore[attr-defined]
        return writer.rows_added  # type: ignore[attr-defined]

    replay.add(rows(np.arange(1000)))
    tasks = [write.options(resources={node: 0.01}).remote(replay.writer(), 100_000 * (i + 1), 40)
             for i, node in enumerate(("node_a", "node_b"))]  # fmt: skip
    steps, start = 0, time.perf_counter()
    while not all(ray.wait([t], timeout=0)[0] for t in tasks):
        batch = replay.sample(256)
        replay.update_priorities(batch.indices, 1 + (batch.data["id"] % 10))  # priority from the row: a known law
        steps += 1
    elapsed = time.perf_counter() - start
    say(f"writers added {sum(ray.get(tasks))} rows while the learner ran {steps} steps "
          f"({steps / elapsed:.0f} sample+update/s, B=256); redraws {replay.stats['redraws']}, "
          f"inexact batches {replay.stats['inexact_batches']}")  # fmt: skip

    # 3. the law: set every row's priority from its id, then count draws.
    for _ in range(20):
        batch = replay.sample(8192)
        replay.update_priorities(batch.indices, 1 + (batch.data["id"] % 10))
    counts = np.zeros(10)
    for _ in range(30):
        np.add.at(counts, replay.sample(4096).data["id"] % 10, 1)
    ids = np.concatenate(
        [ray.get(h.read.remote("id", np.arange(s.size))) for h, s in zip(replay._shards, replay.summaries)]
    )
    mass = np.bincount(ids % 10, weights=1 + ids % 10 + 1e-6, minlength=10)
    p = stats.chisquare(counts, mass / mass.sum() * counts.sum()).pvalue
    say(f"chi-square over the 10 priority classes, {int(counts.sum())} draws across both nodes: p = {p:.3f}")

    # 4. kill the shard on node_b mid-training.
    victim = [node_of[pl] for pl in placement].index("node_b")
    replay.flush()  # a durable point of every shard now; then each takes half a window more
    replay.add(rows(np.arange(200_000, 200_000 + every)))
    before = replay.summaries[victim]
    os.kill(replay.shard_pids()[victim], signal.SIGKILL)
    killed = time.perf_counter()
    batch = replay.sample(256)
    recovered = time.perf_counter() - killed
    after = replay.summaries[victim]
    say(f"shard {victim} (node_b) SIGKILLed with {before.size} rows, {before.flushed_rows} at its last durable point; "
          f"sampling again after {recovered:.2f} s; it restarted with {after.size} rows: "
          f"lost {before.size - after.size} (window: {every} adds)")  # fmt: skip
    replay.update_priorities(batch.indices, np.ones(256))  # drawn before the restart: dropped by the new incarnation
    size_before_detach = len(replay)

    # 5. this learner goes away; another process reattaches by name.
    learner = textwrap.dedent(f"""
        import numpy as np, ray
        ray.init(address="{address}", _node_ip_address="{LOOPBACK}", namespace="hetero_replay", log_to_driver=False)
        from hetero_replay.distributed import ShardedReplay
        replay = ShardedReplay.attach("two-nodes", address="{address}", seed=1)
        n = len(replay)
        for _ in range(20):
            b = replay.sample(64)
            replay.update_priorities(b.indices, np.ones(64))
        replay.add({{"id": np.arange(10), "obs": np.zeros((10, 4), np.float32)}})
        print(n, len(replay))
    """)
    out = subprocess.run([sys.executable, "-c", learner], capture_output=True, text=True, timeout=300)
    seen, now = map(int, out.stdout.split()[-2:])
    say(f"a new learner process reattached: saw {seen} rows (this learner had {size_before_detach}), trained 20 steps, "
          f"added 10: {now}")  # fmt: skip
    replay.close(destroy=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
