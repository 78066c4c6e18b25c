"""What every command of the ``kafka-scheduler`` command line shares: its argument parser, whose errors are one line,
and the error a command raises for bad input (main prints it as one line and exits 2)."""

from __future__ import annotations

import argparse


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad arguments: one line naming the problem, no usage dump and no traceback."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class CommandError(Exception):
    pass
