"""One bash session that runs the docs' commands as a reader types them into a terminal.

Commands run one at a time in the same shell, so what a page sets stays set for the
pages after it: ``. .venv/bin/activate``, ``export``, the working directory. A command
that ends in ``&`` starts a service in the background: its output goes to files of its
own (so that it never mixes with the next command's), and the session waits until it
has printed its first line (its connection string or URL: it is ready). Every service
is stopped with SIGTERM at the end, as the docs say they stop.

Each foreground command reads no input (``</dev/null``) and is bounded in time: one
that does not end is a failure, and the whole session is killed.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Job", "ShellSession"]


@dataclass
class Job:
    """A service started in the background: its command as typed, its process id and
    where its output goes."""

    command: str
    pid: int
    out: Path
    err: Path

    def first_line(self) -> str:
        text = self.out.read_text(errors="replace") if self.out.exists() else ""
        return text.split("\n", 1)[0].strip() if "\n" in text else ""

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return _state(self.pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


class ShellSession:
    """``bash`` in ``cwd`` with ``env``; :meth:`run` a command, :meth:`start` a service."""

    def __init__(self, cwd: Path, env: dict[str, str], logs: Path) -> None:
        self.logs = logs
        self.jobs: list[Job] = []
        self.transcript: list[str] = []
        self.seconds: list[tuple[float, str]] = []  # how long each command took, for the cost of the walk
        self.process = subprocess.Popen(["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                        env=env, start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def _until(self, token: str, timeout: float, command: str) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        output: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                said = "".join(output)[-4000:]
                raise AssertionError(f"$ {command}\ndid not end within {timeout:.0f} s:\n{said}") from None
            if line is None:
                raise AssertionError(f"$ {command}\nthe shell ended:\n{''.join(output)[-4000:]}")
            if line.startswith(token):
                return int(line.split()[1]), "".join(output)
            output.append(line)

    def run(self, command: str, *, timeout: float = 180) -> tuple[int, str]:
        """Run ``command`` as typed (stdin from /dev/null); its exit status and its output
        (stdout and stderr)."""
        token = f"__walk_{uuid.uuid4().hex}"
        started = time.monotonic()
        # A group runs in this shell, so what it sets (activate, export, cd) stays set.
        self._send(f"{{ {command}\n}} </dev/null\nprintf '\\n{token} %s\\n' \"$?\"\n")
        code, output = self._until(token, timeout, command)
        self.seconds.append((time.monotonic() - started, command))
        output = output[:-1] if output.endswith("\n") else output  # the newline printed before the token
        self.transcript.append(f"$ {command}\n{output}")
        return code, output

    def start(self, command: str, *, ready_within: float = 240) -> Job:
        """``command &``: a service, its output to files of its own; returns once it has
        printed its first line."""
        typed = command.strip()
        assert typed.endswith("&") and not re.search(r"&&|\||;", typed[:-1]), \
            f"a background command is one simple command: {command}"
        number = len(self.jobs)
        out, err = self.logs / f"job{number}.out", self.logs / f"job{number}.err"
        code, said = self.run(f"{typed[:-1].strip()} >{out} 2>{err} </dev/null &\nprintf '%s\\n' \"$!\"", timeout=60)
        assert code == 0, said
        job = Job(typed, int(said.split()[-1]), out, err)
        self.jobs.append(job)
        deadline = time.monotonic() + ready_within
        while not job.first_line():
            assert job.alive(), f"$ {typed}\nended before it was ready:\n{out.read_text()}\n{err.read_text()}"
            assert time.monotonic() < deadline, f"$ {typed}\nprinted nothing within {ready_within:.0f} s"
            time.sleep(0.2)
        return job

    def running(self, command: str) -> Job | None:
        """The live job started with exactly ``command``, if any."""
        return next((job for job in self.jobs if job.command == command.strip() and job.alive()), None)

    def stop(self, timeout: float = 60) -> dict[str, int | None]:
        """SIGTERM every service, then end the shell; each service's exit status."""
        for job in self.jobs:
            if job.alive():
                os.kill(job.pid, signal.SIGTERM)
        codes: dict[str, int | None] = {}
        code, said = self.run("for pid in $(jobs -p); do wait $pid; printf '%s %s\\n' $pid $?; done", timeout=timeout)
        exits = dict(line.split() for line in said.splitlines() if line.strip())
        for job in self.jobs:
            status = exits.get(str(job.pid))
            codes[job.command] = int(status) if status is not None else None
        self._send("exit\n")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        return codes

    def kill(self) -> None:
        """End everything the session started, now."""
        for job in self.jobs:
            try:
                os.kill(job.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
