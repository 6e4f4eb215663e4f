"""Image input for MiniCPM-V 4.7 GGUFs: safe image loading, the processor's slice plan (a reference for tests),
and a low-level bindings window onto the patched runtime (`vision.bindings`). Serving goes through llama-server."""
