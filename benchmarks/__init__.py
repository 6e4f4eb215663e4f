"""ggufbridge's measurements: speed, memory and fidelity, never asserted in tests (benchmarks/README.md).

Each module is run from the repository root as `python -m benchmarks.NAME` (the GPU ones as
`python -m benchmarks.gpu.NAME`, by benchmarks/device.sh's jobs); results go to benchmarks/results/. What the
benchmarks share with the tests (builders of models and inputs) lives in ggufbridge.testkit; nothing here edits
sys.path, and no test imports from here (tests/test_import_graph.py checks both)."""
