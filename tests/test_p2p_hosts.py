"""The p2p all_gather refuses groups that span hosts (simulated: LOCAL_WORLD_SIZE ranks per
host, torchrun's numbering): `auto` falls back to torch.distributed, `backend=p2p` is a
BuildError naming the hosts; a group inside one host keeps p2p."""

from __future__ import annotations

from dist_hosts import placement

from executors.backends.p2p import hosts_of
from executors.tools.ranks import run_ranks


def test_hosts_of_numbers_ranks_host_by_host():
    assert hosts_of([0, 1, 2, 3], 2) == [0, 0, 1, 1]
    assert hosts_of([4, 5, 6, 7], 8) == [0, 0, 0, 0]
    assert hosts_of([0, 8], 8) == [0, 1]


def test_spanning_group_falls_back_or_is_refused_and_a_host_group_keeps_p2p():
    per_rank = run_ranks(placement, 4, 2, timeout_s=180)
    for rank, got in enumerate(per_rank):
        assert got["world_auto"] == "torch", got
        assert got["world_explicit"].startswith("BuildError: op 'y' (all_gather) cannot run on cuda; tried p2p:"), got
        assert "group 'tp' spans 2 hosts (host 0: ranks [0, 1], host 1: ranks [2, 3]; 2 ranks per host)" in got["world_explicit"]
        assert got["local_auto"] == "p2p" and got["local_explicit"] == "p2p", (rank, got)
        # build_executor on CPU: an explicit p2p gather is refused with the reason; auto runs and checks
        assert isinstance(got["build_p2p"], str) and "spans 2 hosts" in got["build_p2p"], got["build_p2p"]
        assert got["build_auto"]["ok"], got["build_auto"]
