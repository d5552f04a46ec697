"""Backends that run a recorded `Program` under a `Schedule` and return an `Execution`.

The simulator (`racefuzz.sim.simulate`) is the CPU backend. `racefuzz.backends.cuda.execute` runs the same
program for real: the kernels of `kernels/*.cu` on torch streams, through CuPy. Both return the same
`racefuzz.sim.Execution`, so the oracle and the reports never care which one ran. Importing this package
or `racefuzz.backends.cuda` imports neither torch nor CuPy; they are imported when a GPU run is asked for.
"""
