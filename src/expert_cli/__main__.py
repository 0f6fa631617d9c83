"""`python -m expert_cli ...`: the same as the `expert-cli` console script."""

from expert_cli.cli.app import console_script

console_script()
