"""What ``qm submit --wait`` exits with: how the job ended, as a shell reports a program.

A job that ran to its own end (FINISHED, FAILED) gives its own exit code; one that ended
otherwise gives its state's code below, from 120 to 124: clear of the codes programs
commonly use, of the shell's own (126, 127, 128 + a signal) and of qm's (1: a call
failed, 2: a bad flag), with TIMEOUT at 124 as coreutils' ``timeout`` has it.
"""

from __future__ import annotations

from qm.v1 import types_pb2

from cli.render import state_name

# The one table of them: --wait's help (``described``) and the README show it.
ENDED = {
    types_pb2.JOB_STATE_REJECTED: 120,
    types_pb2.JOB_STATE_LOST: 121,
    types_pb2.JOB_STATE_PREEMPTED: 122,
    types_pb2.JOB_STATE_CANCELLED: 123,
    types_pb2.JOB_STATE_TIMEOUT: 124,
}
# A failed job without an exit code a shell could give (it could not start, or its
# code is out of 1-255), or a job not followed to its end.
FAILED = 1
SIGNALLED = 128  # + the signal that killed it (the agent reports it as -N), as a shell says


def exit_code(job: types_pb2.Job | None) -> int:
    """What ``--wait`` exits with, ``job`` being its last state seen (None: none was)."""
    if job is None:
        return FAILED
    if job.state in ENDED:
        return ENDED[job.state]
    if job.state == types_pb2.JOB_STATE_FINISHED:
        return 0
    if job.state == types_pb2.JOB_STATE_FAILED and 0 < job.exit_code <= 255:
        return job.exit_code
    if job.state == types_pb2.JOB_STATE_FAILED and 0 < -job.exit_code < 256 - SIGNALLED:
        return SIGNALLED - job.exit_code
    return FAILED


def described() -> str:
    """The table, for people."""
    ends = ", ".join(f"{state_name(state)} {code}" for state, code in ENDED.items())
    return (
        f"the job's exit code once it ran to its end (killed by signal N: {SIGNALLED}+N; "
        f"failed without a code of its own: {FAILED}), else by its end: {ends}"
    )
