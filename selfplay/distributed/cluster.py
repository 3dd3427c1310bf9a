"""Joining Ray: a local instance, or a cluster by address, checked against what the run asks for."""

from __future__ import annotations

import math
import os
import socket

from selfplay.config import DistributedConfig
from selfplay.errors import UserError

PROBE_SECONDS = 5


def connect(config: DistributedConfig, learner_gpus: int = 0) -> bool:
    """Join the Ray cluster the config names (`address`, else `RAY_ADDRESS`), or start a local
    one sized for the workers; then check that the cluster can place them. `learner_gpus`: the
    GPUs this machine's sharded learner takes (its last ones, see `learner_group.group_devices`),
    which a local Ray does not offer its workers. Returns whether this call started Ray (and so
    should shut it down)."""
    try:
        import ray
    except ImportError:
        raise UserError(
            "distributed.rollout_workers needs Ray, which is not installed: pip install 'selfplay[distributed]'."
        ) from None
    started = not ray.is_initialized()
    if started:
        address = config.address or os.environ.get("RAY_ADDRESS")
        try:
            if address:
                _probe(address)
                ray.init(address=address, log_to_driver=False)
            else:
                # A local instance: as many CPUs as the machine has, or as the workers ask for. "local",
                # because Ray would otherwise join the cluster it last recorded in its temp dir, which a
                # killed process leaves behind.
                cpus = max(os.cpu_count() or 1, config.rollout_workers * config.worker_cpus)
                # Ray hands out GPUs from 0 up: the first ones, those the learner leaves.
                gpus = max(0, local_gpus() - learner_gpus) if learner_gpus else None
                ray.init(
                    address="local",
                    num_cpus=math.ceil(cpus),
                    num_gpus=gpus,
                    include_dashboard=False,
                    log_to_driver=False,
                )
        except ConnectionError as err:
            reason = str(err).rstrip(".")
            raise UserError(
                f"Cannot reach the Ray cluster at '{address}': {reason}. Start it with `ray start --head` (and "
                "`ray start --address HEAD:6379` on each other node), or unset distributed.address and RAY_ADDRESS "
                "for a local one."
            ) from None
    try:
        check_resources(config, ray.nodes())
        if learner_gpus and not started:
            check_learner_gpus(learner_gpus, ray.nodes(), ray.util.get_node_ip_address(), local_gpus())
    except UserError:
        if started:
            ray.shutdown()
        raise
    return started


def _probe(address: str) -> None:
    """Fail fast on a HOST:PORT that answers nothing: Ray itself retries for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return  # "auto" and client addresses: Ray finds or refuses them quickly
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_SECONDS).close()
    except OSError as err:
        raise ConnectionError(f"nothing answers at {host}:{port} ({err.strerror or err})") from None


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_learner_gpus(learner_gpus: int, nodes: list[dict], address: str, gpus_here: int) -> None:
    """Refuse a cluster whose node on this machine offers rollout workers GPUs that the sharded
    learner takes: Ray cannot know of processes it did not start, and would share them out."""
    here = [node for node in nodes if node.get("Alive") and node["NodeManagerAddress"] == address]
    offered = int(sum(node["Resources"].get("GPU", 0.0) for node in here))
    if offered + learner_gpus > gpus_here:
        raise UserError(
            f"The sharded learner takes {learner_gpus} of this machine's {gpus_here} GPUs (learner.processes), but its "
            f"Ray node offers rollout workers {offered}. Start this node with `ray start ... "
            f"--num-gpus={max(0, gpus_here - learner_gpus)}`, so that workers get only the GPUs the learner leaves."
        )


def check_resources(config: DistributedConfig, nodes: list[dict]) -> None:
    """Refuse, naming the resource, a run whose workers the cluster's live `nodes` cannot hold:
    Ray would otherwise wait for them for ever."""
    alive = [node["Resources"] for node in nodes if node.get("Alive")]
    asks = {"CPU": config.worker_cpus, "GPU": config.worker_gpus}
    for resource, each in asks.items():
        if not each:
            continue
        per_node = [node.get(resource, 0.0) for node in alive]
        fits = sum(int(have / each + 1e-9) for have in per_node)
        if fits < config.rollout_workers:
            key = f"distributed.worker_{resource.lower()}s"
            raise UserError(
                f"The Ray cluster cannot place {config.rollout_workers} rollout workers asking {each:g} {resource} "
                f"each ({key}): its {len(alive)} nodes have {', '.join(f'{have:g}' for have in per_node) or 'no'} "
                f"{resource} and hold {fits}. Lower distributed.rollout_workers or {key}, or add nodes."
            )
