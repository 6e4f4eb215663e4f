"""The GPU jobs' Python side, run on the device by benchmarks/device.sh's shell jobs (benchmarks/README.md)."""
