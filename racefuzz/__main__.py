"""The `racefuzz` command's entry point: the console script (`racefuzz = "racefuzz.__main__:main"`) and
`python -m racefuzz`.

Its first statements take SIGINT and SIGTERM from Python, before anything heavy is imported: a Ctrl-C while
racefuzz is still starting (importing numpy, Hypothesis, a design) is held and ends the command with exit
130 and one line, never a traceback. What the handler does afterwards is `racefuzz.watchdog`'s; the
command itself is `racefuzz.cli.main`.
"""

from __future__ import annotations

import signal
import sys


def main() -> int:
    """Run the `racefuzz` command on `sys.argv[1:]`; its exit code."""
    caught: list[int] = []

    def hold_early(signum: int, frame: object) -> None:  # until racefuzz.watchdog's handler is installed
        caught.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, hold_early)  # back in place after the command: a signal then still exits 130
    from racefuzz.exitcodes import ExitCode

    try:
        from racefuzz import watchdog

        with watchdog.handle_signals(held=caught), watchdog.hold():
            if watchdog.signal_received():  # before the command was even imported
                print(watchdog.interrupted_line(), file=sys.stderr)
                return ExitCode.INTERRUPTED
            from racefuzz import cli

            caught.clear()
            code = cli.main()
        if caught and code != ExitCode.INTERRUPTED:  # after the command, before this returns
            print("racefuzz: interrupted", file=sys.stderr)
            return ExitCode.INTERRUPTED
        return code
    except KeyboardInterrupt:  # a signal racefuzz's handler did not hold (the third during start-up)
        print("racefuzz: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
