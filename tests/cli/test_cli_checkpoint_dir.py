"""`sluice submit --checkpoint-dir`: carried to the API like the spec file's field, so a
job can declare that it checkpoints (what a time-sharing queue asks of the jobs it stops)."""

from scheduling.models import Job


def test_submit_with_a_checkpoint_dir(world, sluice, token_of):
    run = sluice(
        "submit", "-q", "train", "--checkpoint-dir", "ckpt/run-1", "--quiet", "--",
        "python", "train.py",
        token=token_of(world.member),
    )  # fmt: skip
    assert run.code == 0, run.err
    assert Job.objects.get().checkpoint_dir == "ckpt/run-1"


def test_without_the_flag_the_job_has_none(world, sluice, token_of):
    run = sluice("submit", "-q", "train", "--quiet", "--", "true", token=token_of(world.member))
    assert run.code == 0, run.err
    assert Job.objects.get().checkpoint_dir == ""
