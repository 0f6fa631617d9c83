"""The experiment trackers `training.config.report_to` may name: transformers' reporting
integrations, each with the Python module it needs."""

from __future__ import annotations

from typing import Any, Literal

# transformers' reporting integrations (the Python module each needs); TensorBoard's events are
# written by expert-cli itself, whatever this list says
TRACKERS = {
    "wandb": "wandb",
    "mlflow": "mlflow",
    "comet_ml": "comet_ml",
    "clearml": "clearml",
    "trackio": "trackio",
    "swanlab": "swanlab",
    "neptune": "neptune",
    "dvclive": "dvclive",
    "tensorboard": "tensorboard",
}
Tracker = Literal[
    "wandb",
    "mlflow",
    "comet_ml",
    "clearml",
    "trackio",
    "swanlab",
    "neptune",
    "dvclive",
    "tensorboard",
]


def one_or_many(value: Any) -> Any:
    """`report_to`: one name, a list of them, or names joined by commas (`--set
    report_to=wandb,mlflow`: its first name was blamed); "none" (the Trainer's word) for none."""
    if isinstance(value, str):
        return [] if value == "none" else [name.strip() for name in value.split(",")]
    return value
