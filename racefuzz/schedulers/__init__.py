"""Delay strategies beside the random one of `racefuzz.strategies`: one module per strategy (as Shuttle
keeps one file per scheduler). Each decodes a Hypothesis byte string into a `Schedule` for one program,
so the search can shrink it and a counterexample replays like any other."""
