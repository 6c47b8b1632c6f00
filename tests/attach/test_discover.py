"""Finding ranks from their environment (issue 30, item 3), on a /proc laid out as
Linux lays it out: torchrun workers, their agent, MPI and Slurm ranks, and processes
that are not ranks at all."""

from commviz.attach.discover import Launcher, find_ranks, group_jobs


def proc(tmp_path, pid, env: dict, cmd=("/usr/bin/python3", "train.py")):
    d = tmp_path / str(pid)
    d.mkdir()
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmd) + b"\0")


def torchrun_env(rank, run="r1", world=4):
    return {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "GROUP_RANK": 0, "TORCHELASTIC_RUN_ID": run,
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500, "TORCH_FR_BUFFER_SIZE": 2000}


def test_ranks_of_two_jobs_and_nothing_else(tmp_path):
    for r in range(4):
        proc(tmp_path, 100 + r, torchrun_env(r))
    proc(tmp_path, 99, {"TORCHELASTIC_RUN_ID": "r1"}, ("/usr/bin/python3", "-m", "torch.distributed.run"))  # agent
    for r in range(2):
        proc(tmp_path, 200 + r, {"OMPI_COMM_WORLD_RANK": r, "OMPI_COMM_WORLD_SIZE": 2, "OMPI_COMM_WORLD_LOCAL_RANK": r,
                                 "OMPI_MCA_ess_base_jobid": "77", "MASTER_ADDR": "n1"})
    proc(tmp_path, 300, {"RANK": 0, "WORLD_SIZE": 1}, ("/bin/bash", "run.sh"))  # not Python
    proc(tmp_path, 301, {"SLURM_PROCID": 0, "SLURM_NTASKS": 8, "SLURM_JOB_ID": 5})  # an srun task, no rendezvous
    proc(tmp_path, 302, {"RANK": 9, "WORLD_SIZE": 4})  # a rank past the world: not believed
    (tmp_path / "303").mkdir()  # gone, or not ours: no environ to read
    (tmp_path / "self").mkdir()

    jobs = group_jobs(find_ranks(str(tmp_path), skip=set()))
    assert [(j.key, j.launcher, j.world_size, [r.rank for r in j.ranks]) for j in jobs] == [
        ("torchrun:r1", Launcher.TORCHRUN, 4, [0, 1, 2, 3]),
        ("openmpi:77", Launcher.OPENMPI, 2, [0, 1]),
    ]
    r0 = jobs[0].ranks[0]
    assert r0.pid == 100 and r0.local_rank == 0 and r0.has(("TORCH_FR_BUFFER_SIZE",)) == "TORCH_FR_BUFFER_SIZE"


def test_pmi_and_slurm_ranks_with_a_rendezvous_are_found(tmp_path):
    proc(tmp_path, 10, {"PMI_RANK": 1, "PMI_SIZE": 2, "MASTER_ADDR": "a", "MASTER_PORT": 1})
    proc(tmp_path, 11, {"SLURM_PROCID": 3, "SLURM_NTASKS": 4, "SLURM_LOCALID": 1, "SLURM_JOB_ID": 9,
                        "SLURM_STEP_ID": 0, "MASTER_ADDR": "n0"})
    got = {r.pid: (r.launcher, r.rank, r.world_size, r.job) for r in find_ranks(str(tmp_path), skip=set())}
    assert got == {10: (Launcher.PMI, 1, 2, "a:1"), 11: (Launcher.SLURM, 3, 4, "slurm:9.0")}


def test_torchruns_agent_under_srun_is_no_rank(tmp_path):
    """The agent carries SLURM_PROCID and MASTER_ADDR as srun exported them."""
    slurm = {"SLURM_PROCID": 0, "SLURM_NTASKS": 2, "SLURM_JOB_ID": 5, "SLURM_STEP_ID": 0, "MASTER_ADDR": "n0"}
    proc(tmp_path, 50, slurm, ("/usr/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"))
    proc(tmp_path, 51, slurm, ("/usr/bin/python3", "-m", "torch.distributed.run", "train.py"))
    for r in range(2):
        proc(tmp_path, 60 + r, {**slurm, **torchrun_env(r, world=2)})
    assert [(r.pid, r.launcher) for r in find_ranks(str(tmp_path), skip=set())] == [
        (60, Launcher.TORCHRUN), (61, Launcher.TORCHRUN)]
