"""Image and video input for MiniCPM-V 4.7 GGUFs: safe image loading, the processor's slice plan, video sampling.
Serving goes through llama-server; the low-level bindings window the tests use is ggufbridge.testkit.bindings."""
