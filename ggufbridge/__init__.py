"""ggufbridge: MiniCPM-V 4.7 35B-A3B and its DSpark draft as llama.cpp GGUF files."""

__version__ = "0.1.0"
