"""NCCL's shared-memory transport and a container's 64 MB /dev/shm: several
ranks on one machine with too little turn it off instead of failing at the
first step (NCCL itself cannot run here; the decision and the reading can)."""

import logging

from gpt2.process.distributed import SHM_MIN_BYTES, avoid_small_shm, shm_bytes

DOCKER_DEFAULT = 64 << 20


def test_several_local_ranks_on_a_small_shm_turn_nccls_shm_off(caplog):
    env = {}
    with caplog.at_level(logging.WARNING, logger="gpt2.process.distributed"):
        assert avoid_small_shm(8, DOCKER_DEFAULT, env) is True
    assert env == {"NCCL_SHM_DISABLE": "1"}
    assert "/dev/shm holds 64 MB" in caplog.text and "NCCL_SHM_DISABLE=1" in caplog.text


def test_left_alone_when_it_cannot_matter_or_the_user_chose():
    for local_ranks, size, env in ((1, DOCKER_DEFAULT, {}),              # one rank: no peer on this machine
                                   (8, SHM_MIN_BYTES, {}),                # enough
                                   (8, None, {}),                          # no /dev/shm to read
                                   (8, DOCKER_DEFAULT, {"NCCL_SHM_DISABLE": "0"})):  # the user's own setting
        before = dict(env)
        assert avoid_small_shm(local_ranks, size, env) is False
        assert env == before


def test_the_size_is_read_from_the_filesystem(tmp_path):
    assert shm_bytes(str(tmp_path)) > 0
    assert shm_bytes(str(tmp_path / "missing")) is None
