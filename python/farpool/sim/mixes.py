"""Workload mixes: seed 003's SCI traffic mixes and farpool's transactions under RSI.

Seed 003 (Bryhni, Gjessing, Schinco) gives four mixes of interconnect operations:
Table 1 (mix 2, database + operating system: read 21 %, write 11 %, rollout 11 %,
locks 57 %, from 4/2/2/11 operations per TPC-B transaction) and three variants in section 4
(1a: database only, data not shared; 1b: database only, data shared; 3: operating system
dominated). Mix 1b is printed as 21/14/19/50, which sums to 104 %; it is used normalised
(each share divided by 1.04) and the anomaly is reported, not hidden.

farpool's transactions are described by their record accesses (:class:`TxnShape`); their
one-sided operation counts under the RSI protocol (DESIGN.md, "db") are derived step by step
in :func:`rsi_op_counts` so that every count has a stated reason. Measured counts from
``farpool bench txn --json`` (fields ``reads_per_txn``, ``writes_per_txn``, ``cas_per_txn``,
``faa_per_txn``, and ``round_trips_per_txn`` where the row has it) replace the derived ones when
a results file is given (:func:`load_txn_counts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..repo import read_jsonl

SCI_OPS = ("read", "write", "rollout", "lock")


@dataclass(frozen=True)
class SciMix:
    """Shares of SCI operations, in percent as printed in the paper."""

    name: str
    label: str
    read: float
    write: float
    rollout: float
    lock: float

    @property
    def printed_total(self) -> float:
        return self.read + self.write + self.rollout + self.lock

    def shares(self) -> dict[str, float]:
        """Fractions summing to 1 (normalised when the printed shares do not sum to 100)."""
        t = self.printed_total
        return {op: getattr(self, op) / t for op in SCI_OPS}


SCI_MIXES: dict[str, SciMix] = {
    "1a": SciMix("1a", "DB only, data not shared", 25, 17, 8, 50),
    "1b": SciMix("1b", "DB only, data shared", 21, 14, 19, 50),
    "2": SciMix("2", "DB + OS (Table 1)", 21, 11, 11, 57),
    "3": SciMix("3", "OS dominated", 20, 0, 20, 60),
}

# Table 1: operations per TPC-B transaction behind mix 2.
TABLE1_PER_TXN = {"read": 4, "write": 2, "rollout": 2, "lock": 11}


def sci_mix(name: str) -> SciMix:
    try:
        return SCI_MIXES[name]
    except KeyError:
        raise ValueError(f"unknown SCI traffic mix {name!r}; "
                         f"choose one of {', '.join(SCI_MIXES)}") from None


# --------------------------------------------------------------------------------------------
# farpool transactions
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Access:
    """One record a transaction reads (and, if ``write``, updates) through the hash index."""

    table: str
    write: bool


@dataclass(frozen=True)
class TxnShape:
    """What a transaction touches, independent of how a protocol executes it."""

    name: str
    description: str
    accesses: tuple[Access, ...]
    inserts: tuple[str, ...] = ()  # append-only inserts (TPC-B's history row)

    @property
    def written(self) -> tuple[Access, ...]:
        return tuple(a for a in self.accesses if a.write)


BANK = TxnShape(
    "bank", "transfer: read two distinct accounts, move an amount from one to the other",
    (Access("account", True), Access("account", True)))

TPCB = TxnShape(
    "tpcb", "pgbench's TPC-B-like transaction: update account, select its balance, update "
    "teller, update branch, insert history (account, teller, branch chosen independently)",
    (Access("account", True), Access("teller", True), Access("branch", True)),
    inserts=("history",))

SHAPES = {"bank": BANK, "tpcb": TPCB}


def shape(name: str) -> TxnShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown transaction {name!r}; choose one of "
                         f"{', '.join(SHAPES)}") from None


@dataclass
class OpCounts:
    """One-sided operations per committed transaction (no aborts), and, when measured, the
    sequential round trips they take (operations posted together share one)."""

    reads: float
    writes: float
    cas: float
    faa: float
    source: str
    steps: list[str] = field(default_factory=list)
    round_trips: float | None = None

    def as_dict(self) -> dict:
        return {"reads": self.reads, "writes": self.writes, "cas": self.cas,
                "faa": self.faa, "round_trips": self.round_trips, "source": self.source,
                "steps": list(self.steps)}

    def total(self) -> float:
        return self.reads + self.writes + self.cas + self.faa


def rsi_op_counts(s: TxnShape) -> OpCounts:
    """Operation counts of ``s`` under RSI as DESIGN.md describes it.

    * begin: one read of the timestamp vector (one slot per compute thread; the read timestamp
      is taken from it, so there is no global counter);
    * each record: one read of its hash-index bucket, one read of the record (lock/version
      word, commit timestamp and value come back in one read); a later statement on the same
      record (TPC-B's ``SELECT abalance``) is served from the transaction's own write set;
    * commit, per written record: one CAS on the lock/version word (fails if locked or if the
      version is no longer the one read: first committer wins), one write installing the new
      version, one write releasing the lock with the commit timestamp;
    * each insert into an append-only table: one fetch-and-add reserving a slot, one write of
      the row (the slot is private, so no lock);
    * end: one write publishing the commit timestamp in the thread's own vector slot.
    """
    n_acc = len(s.accesses)
    n_w = len(s.written)
    n_ins = len(s.inserts)
    steps = [
        "begin: 1 read of the timestamp vector",
        f"{n_acc} record(s) x (1 index-bucket read + 1 record read) = {2 * n_acc} reads",
        f"commit: {n_w} written record(s) x (1 CAS lock + 1 write new version + "
        f"1 write unlock/commit ts) = {n_w} CAS, {2 * n_w} writes",
    ]
    if n_ins:
        steps.append(f"{n_ins} insert(s) x (1 FAA slot + 1 write row) = {n_ins} FAA, "
                     f"{n_ins} writes")
    steps.append("end: 1 write of the commit timestamp into the thread's vector slot")
    return OpCounts(reads=1 + 2 * n_acc, writes=2 * n_w + n_ins + 1, cas=n_w, faa=n_ins,
                    source="derived (RSI protocol, DESIGN.md); not measured", steps=steps)


TXN_FIELDS = ("engine", "workload", "clients", "threads", "tps", "p50_us", "p99_us",
              "abort_rate", "reads_per_txn", "writes_per_txn", "cas_per_txn", "faa_per_txn")


def load_txn_rows(path: Path) -> list[dict]:
    """Rows of a ``farpool bench txn --json`` results file, checked for the needed fields."""
    return read_jsonl(path, TXN_FIELDS, "transaction row",
                      "produce it with `farpool bench txn ... --json`")


def load_txn_counts(rows: list[dict], workload: str, engine: str = "pool") -> OpCounts | None:
    """Mean measured per-transaction op counts of ``workload`` on ``engine``, if present."""
    sel = [r for r in rows if r["workload"] == workload and r["engine"] == engine]
    if not sel:
        return None
    n = len(sel)
    # Rows written before the benchmark counted round trips lack the field: then none is used.
    rts = [r["round_trips_per_txn"] for r in sel if "round_trips_per_txn" in r]
    return OpCounts(
        reads=sum(r["reads_per_txn"] for r in sel) / n,
        writes=sum(r["writes_per_txn"] for r in sel) / n,
        cas=sum(r["cas_per_txn"] for r in sel) / n,
        faa=sum(r["faa_per_txn"] for r in sel) / n,
        source=f"measured ({n} row(s) of farpool bench txn, engine {engine})",
        round_trips=sum(rts) / n if len(rts) == n else None)
