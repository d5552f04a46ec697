"""Scenarios: host programs written against the device API. `sglang` is the overlap loop over req_to_token."""
