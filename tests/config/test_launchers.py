"""Which environments the WORLD_SIZE note reads as started by a launcher: a leftover WORLD_SIZE
in a shell gets the note; the processes of torchrun, srun, mpirun, DeepSpeed, a Ray worker,
SageMaker's toolkit and Kubeflow's env-only PyTorchJob do not."""

from __future__ import annotations

import pytest

from expert_cli.config.environment import unlaunched_world

LEFTOVER = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    "extra",
    [
        {"TORCHELASTIC_RUN_ID": "none"},
        {"SLURM_PROCID": "0"},
        {"OMPI_COMM_WORLD_RANK": "0"},
        {"RAY_RAYLET_PID": "4242"},
        {"SM_CURRENT_HOST": "algo-1"},
        {"KUBERNETES_SERVICE_HOST": "10.96.0.1"},  # Kubeflow PyTorchJob: env only
        {"KUBERNETES_PORT": "tcp://10.96.0.1:443"},
    ],
    ids=lambda extra: next(iter(extra)),
)
def test_a_launched_process_gets_no_note(extra: dict[str, str]) -> None:
    assert unlaunched_world({**LEFTOVER, **extra}) is None


def test_a_leftover_world_gets_the_note() -> None:
    note = unlaunched_world(LEFTOVER)
    assert note is not None and note.startswith("WORLD_SIZE is 2 (RANK 0) in the environment")
    assert "the other 1 to join" in note
    # in a pod, but without the rendezvous variables a PyTorchJob sets: still a leftover
    pod = {"WORLD_SIZE": "4", "RANK": "x", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    note = unlaunched_world(pod)
    assert note is not None and "(RANK not a number)" in note and "the other 3" in note


@pytest.mark.parametrize("world", ["1", "0", "", "two", "-2"])
def test_one_process_gets_no_note(world: str) -> None:
    assert unlaunched_world({**LEFTOVER, "WORLD_SIZE": world}) is None
