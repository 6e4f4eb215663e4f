"""Test-only synthetic builders and data. What `ggufbridge demo` and the scripts need (the synthetic checkpoint,
tokenizer files, DSpark drafts) ships in the package as ggufbridge.testkit; what only tests use lives here."""
