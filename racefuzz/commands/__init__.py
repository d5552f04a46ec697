"""The CLI's subcommands, one module each; `racefuzz.cli` parses and dispatches."""
