from commviz.launchers import local_rank


def test_each_launchers_local_rank_is_read_and_torchruns_wins():
    assert local_rank({"LOCAL_RANK": "3", "MPI_LOCALRANKID": "1"}) == 3
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}) == 2
    assert local_rank({"MPI_LOCALRANKID": "1", "PMI_RANK": "5"}) == 1
    assert local_rank({"SLURM_LOCALID": "7"}) == 7
    assert local_rank({"LOCAL_RANK": "x"}) is None and local_rank({}) is None
