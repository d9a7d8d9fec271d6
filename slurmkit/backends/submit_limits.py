"""How many more jobs the user may queue: the association's and the QOS's ``MaxSubmitJobs``
(Slurm's accounting, through ``sacctmgr``), less what the user has queued already.

Only asked when the cluster keeps accounting in slurmdbd (``AccountingStorageType``); every
array task counts as one job. The parsing is pure; ``slurm.headroom`` is the thin I/O around it.
"""

from __future__ import annotations

from typing import NamedTuple


class Limit(NamedTuple):
    jobs: int  # the most jobs the user may have queued and running at once
    source: str  # where it comes from, in words ("QOS normal MaxSubmitJobsPerUser")


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def limit(
    assocs: str, qos_table: str, default_account: str, account: str | None, qos: str | None
) -> Limit | None:
    """The tightest submit limit for jobs of ``account`` (default: the user's default account)
    under ``qos`` (default: the association's default QOS, else ``normal``).

    ``assocs``: ``sacctmgr -nP show assoc where user=U
    format=Account,Partition,MaxSubmit,DefaultQOS``; ``qos_table``: ``sacctmgr -nP show qos
    format=Name,MaxSubmitPU``; ``default_account``: the user's. None when nothing limits.
    """
    account = account or default_account.strip() or None
    found: list[Limit] = []
    default_qos = ""
    for line in assocs.splitlines():
        fields = line.split("|")
        if len(fields) < 4 or (account and fields[0] != account):
            continue
        default_qos = default_qos or fields[3].strip()
        jobs = _number(fields[2])
        if jobs is not None:
            where = f"account {fields[0]}" + (f" partition {fields[1]}" if fields[1] else "")
            found.append(Limit(jobs, f"{where} MaxSubmitJobs"))
    qos = qos or default_qos or "normal"
    for line in qos_table.splitlines():
        fields = line.split("|")
        if len(fields) >= 2 and fields[0] == qos and (jobs := _number(fields[1])) is not None:
            found.append(Limit(jobs, f"QOS {qos} MaxSubmitJobsPerUser"))
    return min(found, key=lambda lim: lim.jobs) if found else None
