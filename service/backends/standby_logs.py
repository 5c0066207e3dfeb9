"""One job's part of a standby driver's log.

A standby driver runs job after job in one Ray job (``service.backends.standby``), so its
Ray job's log holds all of them. It prints ``STANDBY_RUN_BEGIN`` + the job's submission id
when it takes a job and ``STANDBY_RUN_END`` + the same id once the job ended
(``workers.warm.standby``); a job's log is what lies between, both lines included. Worker
output reaches the driver's log through Ray a little late, so a last line a worker
printed may fall after the end line: it is then not in the job's part.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from workers.contract import STANDBY_RUN_BEGIN, STANDBY_RUN_END


class JobPart:
    """Picks one job's lines out of a standby's log, line by line."""

    def __init__(self, submission_id: str):
        self.begin = f"{STANDBY_RUN_BEGIN}{submission_id} "
        self.end = f"{STANDBY_RUN_END}{submission_id}"
        self.inside = self.ended = False

    def take(self, line: str) -> bool:
        """Whether ``line`` (the log's next) is the job's; sets ``ended`` after its last."""
        if self.ended:
            return False
        if not self.inside:
            self.inside = line.startswith(self.begin)
            return self.inside
        if line.startswith(STANDBY_RUN_BEGIN):  # the next job's: this one's end was lost
            self.ended = True
            return False
        self.ended = line.rstrip("\n") == self.end
        return True


def job_part(text: str, submission_id: str) -> str:
    """The part of ``text`` (a standby's whole log) that job ``submission_id`` wrote."""
    part = JobPart(submission_id)
    return "".join(line for line in text.splitlines(keepends=True) if part.take(line))


async def follow_part(chunks: AsyncIterator[str], submission_id: str) -> AsyncIterator[str]:
    """From ``chunks`` (a standby's log as it grows), the job's part, up to its end line."""
    part, pending = JobPart(submission_id), ""
    async for chunk in chunks:
        *lines, pending = (pending + chunk).split("\n")
        out = "".join(f"{line}\n" for line in lines if part.take(f"{line}\n"))
        if out:
            yield out
        if part.ended:
            return
