"""Telemetry: GPU and host sampling (gpu.py), FLOPs accounting (flops.py), and the fixed
synthetic training workload (workload.py). Called by training and benchmark; calls neither."""
