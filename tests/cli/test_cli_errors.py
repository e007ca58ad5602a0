"""What scripts rely on: field errors in words and the documented exit codes."""

import socket

from scheduling.models import Job


def test_bad_input_names_the_field_and_exits_1(world, sluice, token_of):
    run = sluice("submit", "-q", "train", "--gpus", "9", "--", "x", token=token_of(world.member))

    assert run.code == 1
    assert run.err.startswith("error: gpus_per_node: "), run.err
    assert "at most 8" in run.err
    assert not Job.objects.exists()


def test_with_json_the_apis_error_body_is_printed_too(world, sluice, token_of):
    run = sluice(
        "submit",
        "-q",
        "train",
        "--class",
        "nope",
        "--json",
        "--",
        "x",
        token=token_of(world.member),
    )

    assert run.code == 1
    body = run.json()
    assert "priority_class" in body["errors"]
    assert "error: priority_class: Unknown priority class 'nope'." in run.err


def test_unknown_ids_and_names_exit_3(world, sluice, token_of):
    key = token_of(world.member)
    assert sluice("show", 999999, token=key).code == 3
    assert sluice("logs", 999999, token=key).code == 3
    run = sluice("submit", "-q", "no-such-queue", "--", "x", token=key)
    assert run.code == 3
    assert "no queue named 'no-such-queue'" in run.err
    # Another tenant's job does not exist for this user.
    from tests import factories as f

    theirs = f.JobFactory(queue=world.other_queue, project=world.other_project)
    assert sluice("show", theirs.pk, token=key).code == 3


def test_no_token_or_a_bad_one_exits_4(world, sluice):
    missing = sluice("ls")
    assert missing.code == 4
    assert "not logged in" in missing.err

    bad = sluice("ls", token="not-a-token")
    assert bad.code == 4
    assert "sluice login" in bad.err


def test_a_server_that_cannot_be_reached_exits_5(world, sluice):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = sluice("ls", token="x", env={"SLUICE_URL": f"http://127.0.0.1:{port}"})

    assert run.code == 5
    assert "cannot reach" in run.err


def test_usage_errors_exit_2(world, sluice, token_of):
    key = token_of(world.member)
    assert sluice("frobnicate", token=key).code == 2
    assert sluice(token=key).code == 2
    no_queue = sluice("submit", "--", "x", token=key)
    assert no_queue.code == 2 and "--queue" in no_queue.err
    no_command = sluice("submit", "-q", "train", token=key)
    assert no_command.code == 2 and "command" in no_command.err
    bad_runtime = sluice("submit", "-q", "train", "-t", "90", "--", "x", token=key)
    assert bad_runtime.code == 2 and "not a duration" in bad_runtime.err
    bad_env = sluice("submit", "-q", "train", "-e", "NOEQUALS", "--", "x", token=key)
    assert bad_env.code == 2 and "KEY=VALUE" in bad_env.err
    assert not Job.objects.exists()


def test_an_ambiguous_queue_name_asks_for_the_tenant(world, sluice, token_of):
    """The platform admin sees nlp/train and vision/train."""
    key = token_of(world.platform_admin)

    run = sluice("submit", "-q", "train", "--", "x", token=key)

    assert run.code == 2
    assert "nlp/train" in run.err and "vision/train" in run.err
    ok = sluice("submit", "-q", "vision/train", "--", "x", token=key)
    assert ok.code == 0, ok.err
    assert Job.objects.get().queue == world.other_queue


def test_without_a_token_an_unreachable_server_is_said_first(world, sluice):
    """No token and no server: `sluice login` cannot help, so the CLI says the server does
    not answer (exit 5), not "not logged in" (exit 4)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    for argv in (("ls",), ("queues",), ("submit", "-q", "train", "--", "x")):
        run = sluice(*argv, env={"SLUICE_URL": url})

        assert run.code == 5, (argv, run.err)
        assert run.err.startswith(f"error: cannot reach {url}: "), run.err
        assert "not logged in" not in run.err
