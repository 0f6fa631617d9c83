"""expert-cli: train LoRA/DoRA/QLoRA expert adapters from HiveLLM manifests, fast."""

__version__ = "0.1.0"
