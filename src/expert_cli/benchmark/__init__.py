"""`expert-cli benchmark` without the printing: sample the GPUs (and host) while a command or
workload runs, read the run's own metrics, assess what holds the GPU back, plot.
"""
