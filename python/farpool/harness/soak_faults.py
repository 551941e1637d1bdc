"""The faults of the soak harness (farpool.harness.soak --faults K --fault-kinds ...): what a
fault is, when it is injected, and what must become of its victim.

A fault is one of FAULT_KINDS, taken in turn every K seconds from the end of the warm-up (replicas
1 or more): kill (`farpool cluster add` starts a server, room for re-replication, then one memory
server is SIGKILLed — in turn a primary that is not the coordinator, then the elected
coordinator), stop (the same, but SIGSTOP for 1.5-4 s, then SIGCONT), client-stop (a bench
client process SIGSTOPped past its session lease), etcd (etcd SIGKILLed and started again on its
data 2 s later) and clock-step (the wall clock of the bench's processes and of one server
stepped by an hour, as a host's NTP step does: see `WallClock`) — each once every region has its
backups again (re-replication done; a second loss before that loses data by design). `Faults`
is the schedule, stepped by the soak's sampling loop (`Faults.tick`); SIGCONTs and etcd's
restart run on timers (`_Later`) or at `Faults.finish`, so no process is left stopped and etcd
is not left dead when the run ends.

How it is judged: what became of each victim is judged at the end, while the cluster still runs
(`Faults.judge`, which returns the failures). The bench exits 0 with faults too (a failover is
the client's to ride out). A client process the bench reports failed (clients_failed) must be
one that a client-stop stopped; a server no fault was aimed at must still run at the end, and a
stopped one must have exited or still serve its own region; an etcd restart must have
succeeded; a clock step changed nothing in its window (the map's epoch, the live servers, no
suspicion, commits going on: `Faults._judge_clock_step`) and the clock server still serves its
own region. A `cluster add` not done within ADD_TIMEOUT_S is killed and failed (`cluster_add`).

This module does not import farpool.harness.soak: the soak imports it, and both read the cluster
and /proc through farpool.harness.soak_probes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from farpool.harness.peers import farpool_bin, log
from farpool.harness.soak_probes import (cluster_status, maps_file, proc_memory, proc_state,
                                         process_group)

FAULT_KINDS = ("kill", "stop", "client-stop", "etcd", "clock-step")
SERVER_STOP_S = (1.5, 4.0)  # from within a server's etcd lease (2 s) to past it and its serving
#                            lease (1 s): both outcomes of `judge` are drawn
CLIENT_STOP_S = (5.0, 8.0)  # past the database's session lease (2 s) + margin (0.5 s), with room
#                             for the others' maintenance pass to judge it (docs/database.md)
# A stopped server resumed (at the end of the run, at the latest) fences itself within its etcd
# lease (2 s) + kServeLease (1 s, src/pool/server/mirror.h) after the failover: judge waits
# twice that for it to exit (or for its region to be its own again) before it fails it.
SERVER_FENCE_S = 2 * (2.0 + 1.0)
STOP_CONFIRM_S = 2.0  # a SIGSTOPped process must show state T within this
ETCD_DOWN_S = 2.0  # etcd dead this long before it is started again on its data
ADD_TIMEOUT_S = 120.0  # a `cluster add` not done by then is killed and counted failed


# The wall-clock offsets of successive clock steps, in seconds: forward an hour, back to the
# host's time, back an hour behind it, forward to it again (steps of +1 h, -1 h, -1 h, +1 h).
CLOCK_OFFSETS_S = (3600, 0, -3600, 0)
LIBFAKETIME = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
               "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
               "/usr/lib/faketime/libfaketimeMT.so.1", "/usr/local/lib/faketime/libfaketimeMT.so.1")


def libfaketime() -> str | None:
    """The multi-threaded libfaketime ($FARPOOL_LIBFAKETIME, else Debian's package `faketime`),
    or None if it is not installed."""
    for path in (os.environ.get("FARPOOL_LIBFAKETIME", ""), *LIBFAKETIME):
        if path and Path(path).exists():
            return path
    return None


class WallClock:
    """The wall clock (CLOCK_REALTIME) of the processes started with `env()`, stepped by
    `step()` while they run, as a host's clock is by an NTP step; nothing else of theirs moves.
    It is libfaketime 0.9.10 preloaded with its offset in a file read at every call
    (FAKETIME_TIMESTAMP_FILE, FAKETIME_NO_CACHE=1) and DONT_FAKE_MONOTONIC=1, which leaves
    CLOCK_MONOTONIC and CLOCK_BOOTTIME (the lease clock) alone in clock_gettime — measured:
    REALTIME, gettimeofday and time() moved by the offset, MONOTONIC and BOOTTIME not
    (docs/pool.md "Clock steps"). The host's clock is never touched.
    libfaketime leaves a shared-memory segment and a semaphore in /dev/shm named by the pid of
    the first preloaded process of a chain unless that process exits cleanly (a killed one never
    does; Python processes sometimes left them too). Only that process creates them: its
    children inherit FAKETIME_SHARED and use its segment. So the caller adds to `pids` the pids
    of the processes it started under the clock (the chain owners), nobody's below them; leaving
    the `with` block removes their files, except those of a pid that runs at that moment (pids
    are reused, and other libfaketime users may run on the host: such a file is no longer
    ours to know), and the offset file (in `directory`, else the temporary directory). Not
    thread-safe; used by the sampling loop only."""

    def __init__(self, lib: str, directory: str | None = None, shm: str = "/dev/shm"):
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="farpool-wall-clock-", dir=directory)
        os.close(fd)
        self.file, self.lib, self.shm = Path(name), lib, Path(shm)
        self.offset = 0
        self.pids: set[int] = set()
        self.step(0)

    def __enter__(self) -> "WallClock":
        return self

    def __exit__(self, *exc) -> None:
        removed = self.cleanup()
        if removed:
            log(f"soak: removed libfaketime's {' '.join(removed)} from /dev/shm")
        self.file.unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        """The environment of a process to run under this clock: this one's plus the preload."""
        preload = " ".join(p for p in (self.lib, os.environ.get("LD_PRELOAD", "")) if p)
        return os.environ | {"LD_PRELOAD": preload, "FAKETIME_TIMESTAMP_FILE": str(self.file),
                             "FAKETIME_NO_CACHE": "1", "DONT_FAKE_MONOTONIC": "1"}

    def step(self, offset: int) -> None:
        """From now on the processes' wall clock is the host's + `offset` seconds. The file is
        replaced whole (renamed), so that no reader sees it half written."""
        tmp = self.file.with_suffix(".new")
        tmp.write_text(f"{offset:+d}\n")
        os.replace(tmp, self.file)
        self.offset = offset

    def cleanup(self) -> list[str]:
        """Removes libfaketime's /dev/shm files of the processes in `pids` that no longer run (a
        zombie is ours still, not reused); returns their names."""
        removed = []
        for pid in sorted(self.pids):
            if proc_state(pid) not in (None, "Z"):
                continue
            for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
                try:
                    (self.shm / name).unlink()
                    removed.append(name)
                except FileNotFoundError:
                    pass
        return removed


class _Later:
    """`fn` run once, `delay` seconds from now on a timer thread, or at once by `now()` (the
    run ended first): a SIGCONT or etcd's restart must happen even if the bench ended early.
    Thread-safe; `now()` returns once `fn` has returned, whoever runs it (an etcd restart the
    timer began must be over before the cluster goes down, and its result judged)."""

    def __init__(self, delay: float, fn):
        self._fn, self._lock, self._started = fn, threading.Lock(), False
        self._ran = threading.Event()
        self._timer = threading.Timer(delay, self.now)
        self._timer.daemon = True
        self._timer.start()

    @property
    def pending(self) -> bool:
        """`fn` has not returned yet."""
        return not self._ran.is_set()

    def now(self) -> None:
        with self._lock:
            first, self._started = not self._started, True
        if first:
            self._timer.cancel()
            try:
                self._fn()
            finally:
                self._ran.set()
        self._ran.wait()


class Faults:
    """The fault schedule of --faults: every `every` seconds from `start` one fault, the kinds
    of --fault-kinds in turn (`kinds`, from FAULT_KINDS):
      * kill: `cluster add` a server, then SIGKILL one — in turn a primary other than the
        coordinator, and the elected coordinator (the order of the server faults, kill and
        stop together).
      * stop: as kill, but SIGSTOP the server for a random SERVER_STOP_S and then SIGCONT:
        once longer than its etcd lease and its serving lease it is failed over and, resumed,
        must fence itself (shut down: its region is served by another) rather than serve a
        stale copy. A stop shorter than the failover may find it still serving: either is fine,
        judged at the end (`judge`).
      * client-stop: SIGSTOP one of the bench's client processes for a random CLIENT_STOP_S,
        past the database's session lease: the others fence it (evict it, recover its
        sessions) and go on; resumed, it finds itself evicted and exits saying so (`bench txn`
        lists it in clients_failed), or, if nobody needed to fence it, goes on.
      * etcd: SIGKILL the cluster's etcd and start it again on its data after ETCD_DOWN_S
        (`cluster restart-etcd`): the servers serve on and their keepalives resume.
      * clock-step: step the wall clock of the bench's processes and of the clock server
        (`clock`, `clock_server`: a server added under it before the bench, never a kill's or
        stop's victim, not even when it is the coordinator: then that turn's victim is a
        primary) to the next of CLOCK_OFFSETS_S; none once `bench_seconds` (the bench's
        measured seconds, counted here from its process's start: they really end later, after
        its load and common start) are over. Nothing may
        change: until the next action of the schedule (its "window") the map keeps its epoch,
        no server that was alive misses from etcd's alive keys and none is suspected at any
        sample that could read etcd (`cluster status`), the clock server runs on serving its
        own region, no client fails, and commits go on after the step and are going on at the
        window's end (the bench's timeline): see `_judge_clock_step`.
    Each fault waits until every region has `replicas` live backups (the added server's own
    region included): with f backups the cluster is built to lose f servers between
    re-replications, not more. The server comes first so that re-replication has room at once:
    added after the kill, it found the survivors' free slots taken by the failover's
    re-replication and its own region stayed without a backup (no server but itself had room).
    Each failover leaves the lost server's region served from a slot for good (a region never
    moves back to a server's own part), so the copies to keep grow by f + 1 per server fault
    while the live servers stay as many: the k-th added server gets (f + 1) × (k + 2) mirror
    slots (a slot costs memory only once it holds a copy). Runs from the sampling loop
    (`tick`), one step at a time; SIGCONTs and etcd's restart run on timers (`_Later`), or at
    `finish`."""

    def __init__(self, cluster_dir: str, cluster_file: str, every: float, start: float,
                 replicas: int, kinds: list[str], seed: int, bench_pid: int,
                 clock: WallClock | None = None, clock_server: int | None = None,
                 bench_seconds: float | None = None):
        self.dir, self.file, self.every, self.replicas = cluster_dir, cluster_file, every, replicas
        self.kinds, self.bench_pid, self.bench_seconds = kinds, bench_pid, bench_seconds
        self.clock, self.clock_server = clock, clock_server
        self.clock_steps = 0
        self.clock_window: dict | None = None  # the last clock step's event, until the next action
        self.rng = random.Random(seed)
        self.next_at = start
        self.events: list[dict] = []
        self.turn = 0  # of the kinds
        self.server_faults = 0  # kills and stops: their victims alternate primary, coordinator
        self.added: dict | None = None  # the event of the server added for the next server fault
        self.waited_since: float | None = None
        self.later: list[_Later] = []
        self.start_time = time.monotonic()

    def protected(self, status: dict) -> str | None:
        """None if every region is served by a live server and has `replicas` live backups;
        else what is missing."""
        etcd = status.get("etcd", {})
        alive = set(etcd.get("alive", []))
        for r in etcd.get("placement", []):
            backups = [b for b in r["backups"] if b in alive]
            if r["served_by"] not in alive or len(backups) < self.replicas:
                return (f"region {r['id']} served by {r['served_by']}, live backups "
                        f"{backups} (alive {sorted(alive)})")
        return None if etcd.get("placement") else f"no placement in etcd: {etcd}"

    def now(self) -> float:
        return round(time.monotonic() - self.start_time, 1)

    def tick(self, t: float, status: dict) -> None:
        """One step of the schedule at `t` s of the run (`status`: `cluster status --json`).
        Nothing starts (no fault, no `cluster add`) while a SIGCONT or an etcd restart is
        pending: faults do not overlap."""
        if self.clock_window is not None:
            self.watch_clock_window(status)
        if t < self.next_at or any(later.pending for later in self.later):
            return
        kind = self.kinds[self.turn % len(self.kinds)]
        server_fault = kind in ("kill", "stop")
        if server_fault and self.added is None:
            self._close_clock_window()
            slots = (self.replicas + 1) * (self.server_faults + 2)
            _, said = cluster_add(self.dir, ["--mirror-slots", str(slots)])
            self.added = {"t_add": round(t, 1), "mirror_slots": slots, "add": said}
            log(f"soak faults: t={t:6.1f}s {self.added['add']}")
            return
        missing = self.protected(status)
        if missing:
            if self.waited_since is None:
                self.waited_since = t
                log(f"soak faults: t={t:6.1f}s {kind} deferred until re-replication: {missing}")
            return
        event = (self.added or {}) | {"t": round(t, 1), "kind": kind,
                                      "waited_for_rereplication_s": round(t - self.waited_since, 1)
                                      if self.waited_since is not None else 0.0}
        self._close_clock_window()
        try:
            done = (self._server(event, status) if server_fault else
                    self._client_stop(event) if kind == "client-stop" else
                    self._clock_step(event, status, t) if kind == "clock-step" else
                    self._etcd(event))
        except OSError as e:  # the victim exited under us (ProcessLookupError): next tick
            log(f"soak faults: t={t:6.1f}s {kind} not done, tried again: {e}")
            return
        if done is None:  # this kind has no victim left: the next kind's turn
            log(f"soak faults: t={t:6.1f}s {kind} skipped: {event['what']}")
            self.turn += 1
            return
        if not done:
            if "what" in event:
                log(f"soak faults: t={t:6.1f}s {kind} not done, tried again: {event['what']}")
            return
        log(f"soak faults: t={t:6.1f}s {event['what']}")
        self.turn += 1
        self.events.append(event)
        self.added = None
        self.waited_since = None
        self.next_at = t + self.every

    def _server(self, event: dict, status: dict) -> bool:
        """kill or stop (event["kind"]) of a primary other than the coordinator, or of the
        coordinator, in turn. Never the clock server, whose clock steps are judged on it: every
        server campaigns, so it can be the coordinator (after a coordinator's kill); the
        coordinator's turn then takes a primary instead, and its event says so."""
        coordinator = status["etcd"].get("coordinator", -1)
        alive = set(status["etcd"]["alive"])
        pids = {s["id"]: s["pid"] for s in json.loads(Path(self.file).read_text())["servers"]}
        coordinator_turn = self.server_faults % 2 == 1 and coordinator in alive
        if coordinator_turn and coordinator != self.clock_server:
            victim, role = coordinator, "coordinator"
        else:
            if coordinator_turn:
                event["spared"] = f"the coordinator {coordinator} is the clock server"
            primaries = [r["id"] for r in status["etcd"]["placement"] if r["served_by"] == r["id"]
                         and r["id"] in alive and r["id"] not in (coordinator, self.clock_server)]
            if not primaries:
                return False
            victim, role = primaries[self.server_faults % len(primaries)], "primary"
            if coordinator_turn:
                role += f" (the coordinator {coordinator} is the clock server)"
        pid = pids[victim]
        event |= {"server": victim, "pid": pid, "role": role}
        if event["kind"] == "kill":
            os.kill(pid, signal.SIGKILL)
            event["what"] = f"SIGKILL server {victim} ({role}, pid {pid})"
        elif not self._stop(event, pid, SERVER_STOP_S, f"server {victim} ({role}, pid {pid})"):
            return False
        self.server_faults += 1
        return True

    def _client_stop(self, event: dict) -> bool | None:
        """A live client process not stopped before, as long as another live one never stopped
        remains (its threads carry the run on: a bench whose every client failed reports
        nothing); None when there is none. Live: not a zombie (a client that failed stays one
        until the end, and SIGSTOP on it would "succeed" while its own failure passed as the
        stop's victim) nor stopped. False (tried again at the next tick) if it did not stop."""
        stopped = {e["pid"] for e in self.events if e["kind"] == "client-stop"}
        clients = sorted(p for p in process_group(self.bench_pid)
                         if p != self.bench_pid and p not in stopped
                         and proc_state(p) not in (None, "Z", "T"))
        if len(clients) < 2:
            event["what"] = (f"{len(stopped)} client processes stopped, {len(clients)} live "
                             "ones never")
            return None
        pid = self.rng.choice(clients)
        event["pid"] = pid
        return self._stop(event, pid, CLIENT_STOP_S, f"client process {pid}")

    def _stop(self, event: dict, pid: int, span: tuple[float, float], name: str) -> bool:
        """SIGSTOP `pid` now, SIGCONT after a random time in `span`. False if it is not stopped
        (state T) within STOP_CONFIRM_S of the signal (it exited, or became a zombie): then
        no stop happened (a SIGCONT goes after it in case it stops late)."""
        stop_s = round(self.rng.uniform(*span), 2)
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + STOP_CONFIRM_S
        while proc_state(pid) != "T":
            if time.monotonic() > deadline:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                event["what"] = f"SIGSTOP {name}: not stopped (state {proc_state(pid)})"
                return False
            time.sleep(0.01)
        event |= {"stop_s": stop_s, "what": f"SIGSTOP {name} for {stop_s} s"}

        def resume() -> None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            event["t_cont"] = self.now()
            log(f"soak faults: t={event['t_cont']:6.1f}s SIGCONT {name}")
        self.later.append(_Later(stop_s, resume))
        return True

    def _clock_step(self, event: dict, status: dict, t: float) -> bool | None:
        """The wall clock of the bench's processes and the clock server to the next offset of
        CLOCK_OFFSETS_S; the event opens a window watched until the schedule's next action.
        None (skipped) once the bench's measured seconds are over: nothing would be left to
        judge. False (tried again) if `status` could not read etcd: the window's judging starts
        from the map and the live servers at the step."""
        if self.bench_seconds is not None and t >= self.bench_seconds:
            event["what"] = f"the bench's {self.bench_seconds:g} measured seconds are over"
            return None
        etcd = status.get("etcd", {})
        if "error" in etcd or "epoch" not in etcd:
            event["what"] = f"cluster status could not read etcd: {etcd.get('error', etcd)}"
            return False
        offset = CLOCK_OFFSETS_S[self.clock_steps % len(CLOCK_OFFSETS_S)]
        step = offset - self.clock.offset
        # The step reaches only processes that have libfaketime mapped: the clock server and
        # every live process of the bench must (judged: a step nobody saw proves nothing).
        pids = {int(s["id"]): int(s["pid"]) for s in json.loads(Path(self.file).read_text())
                ["servers"]}
        watched = ({f"server {self.clock_server}": pids.get(self.clock_server, 0)}
                   if self.clock_server is not None else {}) | {
            f"bench process {p}": p for p in process_group(self.bench_pid)}
        mapped = {name: maps_file(pid, self.clock.lib) for name, pid in watched.items()}
        event["under_clock"] = sorted(n for n, m in mapped.items() if m)
        event["not_under_clock"] = sorted(n for n, m in mapped.items() if m is False)
        event |= {"offset_s": offset, "step_s": step, "wall_ms": int(time.time() * 1000),
                  "epoch": etcd["epoch"], "alive": sorted(etcd.get("alive", [])),
                  "suspected": sorted(etcd.get("suspected", [])),
                  "what": f"wall clock of the bench's processes and server {self.clock_server} "
                          f"stepped {step:+d} s (now the host's {offset:+d} s)"}
        self.clock.step(offset)
        self.clock_steps += 1
        self.clock_window = event
        return True

    def _close_clock_window(self) -> None:
        """The schedule's next action begins: the open clock step's window ends now."""
        if self.clock_window is not None:
            self.clock_window["window_end_ms"] = int(time.time() * 1000)
            self.clock_window = None

    def watch_clock_window(self, status: dict) -> None:
        """One sample of the open clock step's window (judged in `_judge_clock_step`): the
        epochs seen, the servers alive at the step that were missing from etcd's alive keys and
        the servers suspected, each over every sample (a server that lost its lease and
        registered again between two samples is missing from one). A sample that could not
        read etcd says nothing of them: counted apart, not read as nobody alive."""
        etcd = status.get("etcd", {})
        e = self.clock_window
        if "error" in etcd or "epoch" not in etcd:
            e["samples_unreadable"] = e.get("samples_unreadable", 0) + 1
            return
        e["samples"] = e.get("samples", 0) + 1
        e["epochs_in_window"] = sorted(set(e.get("epochs_in_window", [])) | {etcd["epoch"]})
        e["lost_in_window"] = sorted(set(e.get("lost_in_window", []))
                                     | (set(e["alive"]) - set(etcd.get("alive", []))))
        e["suspected_in_window"] = sorted(set(e.get("suspected_in_window", []))
                                          | set(etcd.get("suspected", [])))

    def _etcd(self, event: dict) -> bool:
        pid = int(json.loads(Path(self.file).read_text()).get("etcd", {}).get("pid", 0))
        if pid <= 0:
            return False
        os.kill(pid, signal.SIGKILL)
        event |= {"pid": pid, "what": f"SIGKILL etcd (pid {pid}); restarted in {ETCD_DOWN_S} s"}

        def restart() -> None:
            # It must be gone before it is started again on the same data and ports.
            while proc_memory(pid) is not None:
                time.sleep(0.05)
            try:
                out = subprocess.run([str(farpool_bin()), "cluster", "restart-etcd", "--dir",
                                      self.dir], capture_output=True, text=True, timeout=60)
                event["restart"] = (out.stdout.strip() if out.returncode == 0 else
                                    f"failed ({out.returncode}): {out.stderr.strip()[-300:]}")
            except subprocess.TimeoutExpired:
                event["restart"] = "failed: cluster restart-etcd did not finish within 60 s"
            event["t_restart"] = self.now()
            log(f"soak faults: t={event['t_restart']:6.1f}s {event['restart']}")
        self.later.append(_Later(ETCD_DOWN_S, restart))
        return True

    def finish(self) -> None:
        """Runs the SIGCONTs and etcd's restart still pending (the bench ended first), and
        waits for those a timer already runs."""
        for later in self.later:
            later.now()

    def _placement(self) -> tuple[dict[int, int] | None, str]:
        """region -> the server serving it, from `cluster status`; None and why if it cannot
        tell."""
        try:
            placement = cluster_status(self.dir).get("etcd", {}).get("placement", [])
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            return None, f"cluster status failed: {e}"
        if not placement:
            return None, "cluster status has no placement"
        return {r["id"]: r["served_by"] for r in placement}, ""

    def _judge_stopped(self, server: dict, e: dict, deadline: float) -> list[str]:
        """A stopped server must have exited (fenced itself) or serve its own region; one
        resumed late (at finish) gets until `deadline` to get there. Sets e["outcome"]."""
        sid, pid = server["id"], int(server["pid"])
        while True:
            running = proc_memory(pid) is not None
            placement, why = self._placement() if running else (None, "")
            moved = placement is not None and placement.get(sid, sid) != sid
            if not running or (placement is not None and not moved) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not running:
            e["outcome"] = "exited (fenced itself)"
        elif placement is None:
            e["outcome"] = f"runs on; cannot judge: {why}"
            return [f"cannot judge stopped server {sid} (pid {pid}, stopped at t={e['t']}s): "
                    f"{why}"]
        elif moved:
            e["outcome"] = "runs on, its region moved away"
            return [f"server {sid} (pid {pid}) was stopped at t={e['t']}s, failed over (its "
                    f"region is served by {placement[sid]}), and still runs (waited up to "
                    f"{SERVER_FENCE_S:.0f} s after the run): not fenced"]
        else:
            e["outcome"] = "runs on, serving its region"
        return []

    def _judge_clock_step(self, e: dict, timeline: dict | None) -> list[str]:
        """A clock step changed nothing in its window (until the next action, or the judging):
        at every sample that read etcd the map's epoch was the step's, every server alive at the
        step was alive, none was suspected (no readable sample: a failure, nothing was seen);
        and from the bench's `timeline` (its JSON "timeline": start_unix_ms, bucket_ms, commits)
        the whole buckets after the step and before both the window's end and the end of the
        bench's measured seconds: some commits in them, and some in the last of them (commits
        had resumed, not stalled for most of the window). A step with no such bucket (taken in
        the last bucket of the run, or just before the next action) is "not judged" on its
        commits, never a pass. Sets e["outcome"]."""
        failures = []
        what = f"clock step {e['step_s']:+d} s at t={e['t']}s"
        if e.get("not_under_clock") or not e.get("under_clock"):
            failures.append(f"{what}: libfaketime is not mapped in "
                            f"{', '.join(e.get('not_under_clock') or ['any process'])}: the "
                            "step did not reach them")
        if not e.get("samples"):
            failures.append(f"{what}: no sample of its window could read etcd "
                            f"({e.get('samples_unreadable', 0)} could not): the map, the live "
                            "servers and the suspicions were not seen")
        if set(e.get("epochs_in_window", [e["epoch"]])) != {e["epoch"]}:
            failures.append(f"{what}: the cluster map changed in its window: epoch {e['epoch']} "
                            f"-> {[x for x in e['epochs_in_window'] if x != e['epoch']]}")
        if e.get("lost_in_window"):
            failures.append(f"{what}: servers {e['lost_in_window']} lost their etcd lease in "
                            "its window")
        if e.get("suspected_in_window"):
            failures.append(f"{what}: servers {e['suspected_in_window']} were reported gone in "
                            "its window")
        judged = False
        if timeline is None:
            e["commits_after"] = None
            failures.append(f"{what}: the bench reported no timeline: cannot tell whether "
                            "commits went on")
        else:
            bucket, start = timeline["bucket_ms"], timeline["start_unix_ms"]
            commits = timeline["commits"]
            # Whole buckets only: the first wholly after the step (none before the bench's
            # start: a negative index would count from the end), the last wholly before the
            # window's end and within the measured seconds (the bucket after them holds only
            # the commits of transactions that ended late).
            first = max(0, (e["wall_ms"] - start) // bucket + 1)
            end_ms = e.get("window_end_ms", int(time.time() * 1000))
            last = min(len(commits), (end_ms - start) // bucket)
            if self.bench_seconds is not None:
                last = min(last, int(self.bench_seconds * 1000) // bucket)
            after = commits[first:last] if last > first else []
            before = commits[max(0, first - 1 - len(after)):max(0, first - 1)]
            e["commits_after"] = sum(after)
            e["buckets_after"] = len(after)
            e["tps_before"] = round(sum(before) * 1000 / (bucket * len(before))) if before else None
            e["tps_after"] = round(sum(after) * 1000 / (bucket * len(after))) if after else None
            judged = bool(after)
            if after and not sum(after):
                failures.append(f"{what}: no commit in the {len(after) * bucket / 1000:.0f} s "
                                "after it")
            elif after and not after[-1]:
                stalled = next(i for i in range(len(after)) if not any(after[i:]))
                failures.append(f"{what}: commits had not resumed by its window's end: none in "
                                f"its last {(len(after) - stalled) * bucket / 1000:.0f} s of "
                                f"{len(after) * bucket / 1000:.0f}")
        if failures:
            e["outcome"] = "; ".join(failures)
        elif not judged:
            e["outcome"] = (f"not judged: no whole bucket after it (commits); epoch {e['epoch']}, "
                            f"servers {e['alive']} alive, none suspected")
        else:
            e["outcome"] = (f"nothing changed: epoch {e['epoch']}, servers {e['alive']} alive, "
                            f"none suspected, {e['commits_after']} commits after it, some in its "
                            "last whole bucket")
        return failures

    def judge(self, failed_clients: dict[int, dict] | None,
              timeline: dict | None = None) -> list[str]:
        """The end of a run with faults: what became of every process, each outcome in its
        event; returns the failures. A server no fault was aimed at must still run; a stopped
        server either exited (it fenced itself once resumed) or runs on serving its own region
        (its stop was shorter than the failover), within SERVER_FENCE_S for one resumed at
        `finish`; a stopped client process either failed (it was fenced: `bench txn` lists it
        in clients_failed, pid -> entry in `failed_clients`) or finished (nobody needed to
        fence it); no other client may fail; an etcd restart must have succeeded; a clock step
        changed nothing (`_judge_clock_step`; `timeline`: the bench's) and the clock server
        still serves its own region. `failed_clients` None: the bench reported nothing (its
        failure is the run's)."""
        failures = []
        if self.clock_window is not None:
            try:
                self.watch_clock_window(cluster_status(self.dir))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failures.append(f"clock step at t={self.clock_window['t']}s: cluster status "
                                f"failed at the end: {e}")
        for e in self.events:
            if e["kind"] == "clock-step":
                failures += self._judge_clock_step(e, timeline)
        if self.clock_server is None and any(e["kind"] == "clock-step" for e in self.events):
            failures.append("clock steps without a clock server (its `cluster add` failed): "
                            "only the bench's processes were stepped")
        elif self.clock_server is not None and any(e["kind"] == "clock-step"
                                                   for e in self.events):
            placement, why = self._placement()
            if placement is None:
                failures.append(f"cannot judge clock server {self.clock_server}: {why}")
            elif placement.get(self.clock_server) != self.clock_server:
                failures.append(f"clock server {self.clock_server}: its region is served by "
                                f"{placement.get(self.clock_server)}")
        config = json.loads(Path(self.file).read_text())
        victims = {e["server"]: e for e in self.events if "server" in e}
        deadline = time.monotonic() + SERVER_FENCE_S
        for s in config["servers"]:
            e = victims.get(s["id"])
            if e is None:
                if not s.get("pid") or proc_memory(int(s["pid"])) is None:
                    failures.append(f"server {s['id']} (pid {s.get('pid')}) is gone, but no "
                                    "fault was aimed at it")
            elif e["kind"] == "stop":
                failures += self._judge_stopped(s, e, deadline)
        stopped = {e["pid"] for e in self.events if e["kind"] == "client-stop"}
        for e in self.events:
            if e["kind"] == "client-stop":
                c = (failed_clients or {}).get(e["pid"])
                e["outcome"] = (f"failed ({c['how']}): {c['error']}" if c else
                                "finished" if failed_clients is not None else "unknown")
            if e["kind"] == "etcd" and not e.get("restart", "").startswith("cluster restart"):
                failures.append(f"etcd killed at t={e['t']}s: restart {e.get('restart')}")
        failures += [f"client process {pid} failed ({c['how']}), but no fault stopped it: "
                     f"{c['error']}" for pid, c in (failed_clients or {}).items()
                     if pid not in stopped]
        return failures


def cluster_add(cluster_dir: str, extra: list[str],
                clock: WallClock | None = None) -> tuple[bool, str]:
    """`farpool cluster add --dir cluster_dir EXTRA`, under `clock` if given (the server it
    starts inherits its environment, through `ip netns exec` too; the command is the chain's
    first preloaded process, so its pid goes to clock.pids at once). Returns whether it
    succeeded and what it said: its output, or "failed (...)" with the reason. One that has not
    finished within ADD_TIMEOUT_S is killed and failed (the run goes on without the server)."""
    add = subprocess.Popen([str(farpool_bin()), "cluster", "add", "--dir", cluster_dir, *extra],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=clock.env() if clock is not None else None)
    if clock is not None:
        clock.pids.add(add.pid)
    try:
        out, err = add.communicate(timeout=ADD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        add.kill()
        _, err = add.communicate()
        return False, (f"failed: cluster add did not finish within {ADD_TIMEOUT_S:g} s, "
                       f"killed: {err.strip()[-300:]}")
    if add.returncode != 0:
        return False, f"failed ({add.returncode}): {err.strip()[-300:]}"
    return True, out.strip()


def add_clock_server(cluster_dir: str, cluster_file: str, clock: WallClock) -> dict:
    """A server added under `clock` (`cluster_add`): its id, pid and what the command said;
    {"add": "failed ..."} if it was not added (the run goes on, its clock steps judged failed
    for want of a clock server)."""
    ok, said = cluster_add(cluster_dir, [], clock)
    if not ok:
        return {"add": said}
    server = json.loads(Path(cluster_file).read_text())["servers"][-1]
    return {"id": server["id"], "pid": int(server["pid"]), "add": said}
