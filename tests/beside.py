"""Checks that run beside the tests at the lowest CPU priority (``pytest --beside COMMAND``).

``./scripts/test`` type-checks the package with mypy: a cold check is about 15 s of CPU, and run
before pytest it added that to the suite's wall time. Started with pytest at the lowest priority
instead, it takes only the CPU that the two workers leave idle (while a worker waits on the
browser, and at the end when one worker has finished); on a busy machine it simply finishes
later. Its output is printed before pytest's closing line, and its failure fails the run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import IO

OPTION = "--beside"


def lowest_priority() -> None:
    """In the child, before it runs: the kernel gives it CPU only when nothing else wants it."""
    if hasattr(os, "nice"):
        os.nice(19)


@dataclass
class BesideCheck:
    """One command started beside the tests, its output kept in a file until the summary."""

    command: list[str]
    output: IO[str] = field(default_factory=lambda: tempfile.TemporaryFile("w+"))
    process: subprocess.Popen | None = None
    seconds: float = 0.0  # from its start to its exit
    waiter: threading.Thread | None = None

    def start(self) -> BesideCheck:
        started = time.monotonic()
        try:
            self.process = subprocess.Popen(
                self.command,
                stdout=self.output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=lowest_priority if os.name == "posix" else None,
            )
        except OSError as error:
            self.output.write(f"could not start: {error}\n")
            return self

        def time_it(process: subprocess.Popen) -> None:
            process.wait()
            self.seconds = time.monotonic() - started

        self.waiter = threading.Thread(target=time_it, args=(self.process,), daemon=True)
        self.waiter.start()
        return self

    def wait(self) -> int:
        """The command's exit status once it has finished (127 when it could not start)."""
        if self.process is None or self.waiter is None:
            return 127
        self.waiter.join()
        return self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def text(self) -> str:
        self.output.seek(0)
        return self.output.read()

    @property
    def name(self) -> str:
        return shlex.join(self.command)


def start_all(commands: list[str]) -> list[BesideCheck]:
    return [BesideCheck(shlex.split(command)).start() for command in commands]


def failed(checks: list[BesideCheck]) -> list[BesideCheck]:
    """Wait for every check; the ones that did not exit 0."""
    return [check for check in checks if check.wait() != 0]


def summary_lines(checks: list[BesideCheck]) -> list[str]:
    """What each check printed, under a line with its command, exit status and wall time."""
    lines = []
    for check in checks:
        status = check.wait()
        verdict = "passed" if status == 0 else f"FAILED (exit {status})"
        lines.append(f"{check.name}: {verdict}, {check.seconds:.0f} s beside the tests")
        lines.extend("  " + line for line in check.text().rstrip().splitlines())
    return lines
