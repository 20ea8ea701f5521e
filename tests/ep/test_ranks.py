"""Simulated ranks: deep_gemm.testing.spawn / init_dist, the shared-memory process group, and SymmetricBuffer (remote
stores visible to the peer, the [R, nbytes] view); failures: an exception, a SIGKILL, an early exit and a hang each
end every rank with a clear RankFailedError, and no /dev/shm segment of the run is left."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import numpy as np
import pytest

import deep_gemm
from deep_gemm.ep import RankFailedError, SymmetricBuffer, _shm
from deep_gemm.testing import init_dist, spawn


def leftovers(prefix):
    return [n for n in os.listdir(_shm.SHM_DIR) if n.startswith(prefix)]


def stores_and_views(rank, num_ranks, nbytes):
    r, n, group = init_dist(rank, num_ranks)
    assert (r, n) == (rank, num_ranks) and group.size() == num_ranks
    a = SymmetricBuffer(group, nbytes)
    b = SymmetricBuffer(group, 64)  # a second allocation, in the same order on every rank
    assert a.all.shape == (num_ranks, a.nbytes) and a.all.dtype == np.uint8 and a.nbytes >= nbytes
    assert a.local.base is not None and np.shares_memory(a.local, a.all[rank])
    assert not a.local.any()  # zero-filled
    group.barrier()  # nobody stores before everyone looked
    # Remote stores: rank r writes its id into slot r of every peer's buffer (the UBMEM store), then a barrier
    for dst in range(num_ranks):
        a.view(np.int32, 0, num_ranks, rank=dst)[rank] = 100 * dst + rank
        b.all[dst, rank] = rank + 1
    a.barrier()
    got = a.view(np.int32, 0, num_ranks, rank=rank).tolist()
    objs = group.all_gather_object({"rank": rank, "pid": os.getpid()})
    root = group.broadcast_object(("from", rank), src=num_ranks - 1)
    segment = a.name
    a.close(), b.close()
    return got, b.nbytes, [o["rank"] for o in objs], len({o["pid"] for o in objs}), root, segment


@pytest.mark.parametrize("num_ranks", [1, 3])
def test_symmetric_buffer_remote_stores(num_ranks):
    results = spawn(stores_and_views, num_ranks, 1000)
    for rank, (got, nbytes_b, ranks, pids, root, segment) in enumerate(results):
        assert got == [100 * rank + src for src in range(num_ranks)]
        assert nbytes_b == 64 and ranks == list(range(num_ranks)) and pids == num_ranks
        assert root == ("from", num_ranks - 1)
        if num_ranks > 1:
            assert segment.startswith(_shm.SEGMENT_PREFIX) and not os.path.exists(os.path.join(_shm.SHM_DIR, segment))


def test_world_of_one_without_spawn():
    rank, num_ranks, group = init_dist(0, 1)
    assert (rank, num_ranks) == (0, 1)
    buf = deep_gemm.SymmetricBuffer(group, 100)
    assert buf.all.shape == (1, 128) and buf.rank == 0 and buf.num_ranks == 1
    buf.local[:4] = 7
    buf.barrier()
    assert buf.all[0, :4].tolist() == [7] * 4
    buf.close()
    with pytest.raises(ValueError, match="nbytes"):
        SymmetricBuffer(group, 0)
    with pytest.raises(ValueError, match="spawn"):
        init_dist(0, 2)


def raises_in_rank(rank, num_ranks):
    _, _, group = init_dist(rank, num_ranks)
    if rank == 1:
        raise KeyError("bad expert 17")
    group.barrier()


def exits_early(rank, num_ranks):
    _, _, group = init_dist(rank, num_ranks)
    if rank == 0:
        return "done"
    group.barrier()


def exits_hard(rank, num_ranks):
    _, _, group = init_dist(rank, num_ranks)
    if rank == 2:
        os._exit(3)
    group.barrier()


def check_the_others_failed_clearly(err: RankFailedError, failed: int, num_ranks: int, t0: float) -> None:
    """Every other rank ended with a RankFailedError naming the failed rank, no segment is left, and nobody waited
    for the group's rank timeout (a generous bound: a hang would take minutes)."""
    assert err.failed_rank == failed
    for rank in set(range(num_ranks)) - {failed}:
        assert isinstance(err.rank_errors[rank], RankFailedError), err.rank_errors[rank]
        assert f"rank {failed}" in str(err.rank_errors[rank])
    assert not leftovers(err.prefix)
    assert time.monotonic() - t0 < 60


def test_exception_in_one_rank_propagates():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match="rank 1 of 3 failed") as info:
        spawn(raises_in_rank, 3)
    err = info.value
    assert isinstance(err.__cause__, KeyError) and "bad expert 17" in str(err)
    check_the_others_failed_clearly(err, 1, 3, t0)


@contextlib.contextmanager
def _ranks_in_this_process(num_ranks: int, **kwargs):
    """Every rank of a ``num_ranks`` ShmGroup, in this process (their control segment and heartbeat threads), for
    tests that set the order of the ranks' reads and writes; each rank still running finishes ok at the end."""
    from deep_gemm.ep.group import ShmGroup, control_nbytes, init_control

    prefix = _shm.new_run_prefix()
    mm = _shm.create(prefix + "control", control_nbytes(num_ranks))
    groups = []
    try:
        init_control(mm, num_ranks)
        groups = [ShmGroup(prefix + "control", prefix, rank, num_ranks, **kwargs) for rank in range(num_ranks)]
        yield mm, groups
    finally:
        for group in groups:
            if not group._closed:
                group.finish(True)
            group._beat.join()  # the heartbeat thread ends once its rank has finished
        mm.close()
        _shm.unlink_all(prefix)


def test_a_failing_rank_aborts_the_group_before_its_status_says_failed(monkeypatch):
    """A peer that sees a FAILED status must find the abort word already naming that rank: else the peer's own abort
    (it fails in turn) wins the word and the run blames the peer (seen once under load in
    test_exception_in_one_rank_propagates: "rank 2 of 3 failed" for rank 1's KeyError)."""
    from deep_gemm.ep.group import STATUS_FAILED, read_abort

    with _ranks_in_this_process(2) as (mm, (group, _)):
        status_at_abort = []
        abort = group.abort
        monkeypatch.setattr(group, "abort", lambda why: (status_at_abort.append(int(group._ranks[0, 0])), abort(why)))
        group.finish(False)
        assert status_at_abort and status_at_abort[0] != STATUS_FAILED, "FAILED was visible before the abort word"
        assert int(group._ranks[0, 0]) == STATUS_FAILED and read_abort(mm)[:2] == (True, 0)


class _PeerFinishesBetweenReads:
    """rank 1's view of the control rows in which rank 0 arrives at the barrier, passes it and finishes right after
    rank 1 first reads rank 0's epoch word (the reader gets the old word), or else before rank 1's second readiness
    check (rank 0 merely late)."""

    def __init__(self, ranks, status_done):
        self.ranks, self.status_done, self.slices, self.arrived = ranks, status_done, 0, False

    def _arrive(self):
        if not self.arrived:
            self.arrived = True
            self.ranks[0, 2] = 1
            self.ranks[0, 0] = self.status_done

    def __getitem__(self, index):
        value = self.ranks[index]
        if index == (0, 2):
            self._arrive()  # after the read: the reader holds rank 0's old epoch
        elif isinstance(index, tuple) and isinstance(index[0], slice):
            self.slices += 1
            if self.slices == 2:
                self._arrive()
                value = self.ranks[index]
        return value

    def __setitem__(self, index, value):
        self.ranks[index] = value


def test_a_peer_that_passed_the_barrier_and_finished_is_not_blamed_for_it():
    """Seen once (8 ranks on 2 CPUs): "rank 0 finished without reaching barrier 33" while every rank was ok. The
    waiting rank read rank 0's epoch before rank 0 arrived and its DONE status after rank 0 had passed and finished."""
    from deep_gemm.ep.group import STATUS_DONE

    with _ranks_in_this_process(2, timeout=5.0) as (_, (_, waiting)):
        waiting._ranks = _PeerFinishesBetweenReads(waiting._ranks, STATUS_DONE)
        waiting.barrier()  # rank 0 reached it: no RankFailedError
        assert waiting._ranks.arrived


class _PeersFailAfterRead:
    """A rank's view of the control rows in which, right after it first reads ``index``, rank 1 fails and then rank 2
    fails because of it (both through finish(False), as the bootstrap does)."""

    def __init__(self, ranks, index, fail):
        self.ranks, self.index, self.fail, self.fired = ranks, index, fail, False

    def __getitem__(self, index):
        value = self.ranks[index]
        if index == self.index and not self.fired:
            self.fired = True
            self.fail()
        return value

    def __setitem__(self, index, value):
        self.ranks[index] = value


def test_a_check_during_a_cascade_blames_the_rank_that_failed_first():
    """Rank 0 checks the group while rank 1 fails and rank 2 fails in turn: rank 0 read rank 1's status before it
    failed and rank 2's after. It must still blame rank 1 (the abort word), not the first FAILED status it saw."""
    with _ranks_in_this_process(3) as (_, groups):
        checker = groups[0]
        checker._ranks = _PeersFailAfterRead(checker._ranks, (1, 0),
                                             lambda: (groups[1].finish(False), groups[2].finish(False)))
        with pytest.raises(RankFailedError) as info:
            checker.check()
        assert checker._ranks.fired and info.value.failed_rank == 1, str(info.value)


def test_early_exit_and_os_exit_are_reported():
    with pytest.raises(RankFailedError, match="rank 0 finished without reaching barrier"):
        spawn(exits_early, 2)
    with pytest.raises(RankFailedError, match="rank 2 exited with code 3") as info:
        spawn(exits_hard, 3, start_method="forkserver")
    assert info.value.failed_rank == 2
    assert not any("launching process" in str(e) for e in info.value.rank_errors if e)
    assert not leftovers(info.value.prefix)


def killed_rank(rank, num_ranks):
    _, _, group = init_dist(rank, num_ranks)
    buf = SymmetricBuffer(group, 1 << 16)
    group.barrier()
    if rank == 1:
        # a segment still named when the rank dies: only the supervisor can remove it
        _shm.create(group.new_segment_name("orphan"), 4096)
        os.kill(os.getpid(), signal.SIGKILL)
    group.barrier()
    buf.local[:] = 1
    group.barrier()


def test_killed_rank_leaves_no_segment_and_the_others_fail_clearly():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match="rank 1 was killed by SIGKILL") as info:
        spawn(killed_rank, 4)
    assert info.value.prefix.startswith(_shm.SEGMENT_PREFIX)
    check_the_others_failed_clearly(info.value, 1, 4, t0)


def hangs(rank, num_ranks):
    _, _, group = init_dist(rank, num_ranks)
    if rank == 1:
        time.sleep(120)
    group.barrier()


def test_hung_rank_times_out():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match="timed out") as info:
        spawn(hangs, 2, timeout=5, rank_timeout=2)
    assert time.monotonic() - t0 < 40 and not leftovers(info.value.prefix)


def warmup_setting(rank, num_ranks):
    return os.environ.get("DG_JIT_WARMUP")


def test_ranks_that_would_share_cpus_with_their_helpers_run_without_them(monkeypatch):
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.delenv("DG_JIT_WARMUP", raising=False)
    for ranks in (1, 2):
        expected = "0" if 2 * ranks > cpus else None  # ranks + a helper each vs the CPUs (2 ranks on 2 CPUs: "0")
        assert spawn(warmup_setting, ranks) == [expected] * ranks
    monkeypatch.setenv("DG_JIT_WARMUP", "1")
    assert spawn(warmup_setting, 2) == ["1", "1"]  # the user's setting stands


def test_spawn_checks_its_arguments():
    with pytest.raises(ValueError, match="num_ranks"):
        spawn(hangs, 0)
    with pytest.raises(ValueError, match="start_method"):
        spawn(hangs, 2, start_method="fork")
    with pytest.raises(TypeError, match="callable"):
        spawn(None, 2)
