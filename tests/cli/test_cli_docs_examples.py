"""The documented examples run as written against the demo.

The demo is seeded into the test database (``manage.py seed_demo``, as ``make run`` does),
with the ids starting at 1 as in a fresh demo. Then, in order:

- every ``sluice`` line of the ``sh`` blocks of docs/user/cli.md goes through
  ``main(argv, env)``; ``42`` (``43``, ...) stands for the first (second, ...) job a
  ``submit`` line printed; ``-f job.yaml`` reads the page's ``yaml`` block;
- every ``curl`` example of docs/user/api.md runs in bash, the server's address aside;
- the README's *A first job* runs in bash as written, with the installed ``sluice``
  (``SLUICE_URL`` names the test server; a fresh ``SLUICE_CONFIG``).

The examples are read from the files, so that a change to them that no longer works fails
here.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command

from accounts.models import ApiToken
from portal.management.commands.seed_demo import DEMO_PASSWORD
from scheduling.models import Job, PriorityRaise

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "user" / "cli.md"
API_PAGE = ROOT / "docs" / "user" / "api.md"
README = ROOT / "README.md"
DEMO_URL = "http://127.0.0.1:8000"
PLACEHOLDER_IDS = ("42", "43", "44")


def fenced(text: str, language: str) -> list[str]:
    """The bodies of the ``` fences of ``language`` (indented ones too)."""
    pattern = rf"^([ \t]*)```{language}[ \t]*\n(.*?)^\1```"
    blocks = []
    for indent, body in re.findall(pattern, text, re.M | re.S):
        blocks.append("\n".join(line[len(indent) :] for line in body.splitlines()))
    return blocks


def section(text: str, title: str) -> str:
    """A ``## title`` section of a Markdown page, up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return match.group(1) if match else ""


def cli_lines() -> list[list[str]]:
    lines = []
    for block in fenced(CLI_PAGE.read_text(), "sh"):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                assert argv[0] == "sluice", f"not a sluice command in {CLI_PAGE.name}: {line}"
                lines.append(argv[1:])
    return lines


def curl_examples() -> list[str]:
    """Shell snippets holding ``curl``: docs/user/api.md's sh blocks."""
    return [b for b in fenced(API_PAGE.read_text(), "sh") if "curl " in b]


def readme_first_job() -> str:
    blocks = fenced(section(README.read_text(), "A first job"), "sh")
    assert len(blocks) == 1, "README's *A first job* has one sh block"
    return blocks[0]


def json_documents(text: str) -> list:
    decoder, docs, at = json.JSONDecoder(), [], 0
    text = text.strip()
    while at < len(text):
        doc, end = decoder.raw_decode(text, at)
        docs.append(doc)
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return docs


@pytest.fixture
def demo(live_server, transactional_db):
    call_command("seed_demo", stdout=io.StringIO())


def test_the_pages_have_examples_to_run():
    assert cli_lines()[0] == ["login"]
    assert any(argv[0] == "submit" for argv in cli_lines())
    assert any("/api/v1/auth/token" in snippet for snippet in curl_examples())


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_every_cli_example_runs_as_written_against_the_demo(demo, sluice, monkeypatch, tmp_path):
    monkeypatch.setattr("builtins.input", lambda prompt: "nlp-member")
    monkeypatch.setattr("getpass.getpass", lambda prompt: DEMO_PASSWORD)
    yaml_blocks = fenced(CLI_PAGE.read_text(), "yaml")
    (tmp_path / "job.yaml").write_text(yaml_blocks[0] if yaml_blocks else "")
    monkeypatch.chdir(tmp_path)
    submitted: list[str] = []
    failures = []

    for argv in cli_lines():
        ids = dict(zip(PLACEHOLDER_IDS, submitted, strict=False))
        argv = [ids.get(arg, arg) for arg in argv]
        run = sluice(*argv)
        if run.code != 0:
            failures.append(f"sluice {shlex.join(argv)} → exit {run.code}: {run.err.strip()}")
            continue
        if argv[0] == "submit":
            submitted += re.findall(r"Submitted job (\d+)", run.out)

    assert failures == []
    # What the lines did, in the demo's database.
    first = Job.objects.get(pk=submitted[0])
    assert first.submitted_by.username == "nlp-member"
    assert (first.tenant.slug, first.queue.name, first.name) == ("nlp", "train", "bert")
    assert PriorityRaise.objects.filter(job=first, to_class__name="high").exists()
    assert first.state in ("CANCELLED", "STOPPING")
    from_file = Job.objects.get(name="bert-base")
    assert from_file.project.slug == "llm-pretrain" and from_file.gpu_models == ["H100-80GB"]
    assert not ApiToken.objects.exists(), "logout revokes the token"


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_every_curl_example_runs_as_written_against_the_demo(demo, live_server):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    jobs_before = Job.objects.count()
    token = None

    for snippet in curl_examples():
        # A reader runs the blocks in one shell: a TOKEN one block sets, the next ones use.
        script = snippet.replace(DEMO_URL, live_server.url)
        script += '\necho "__TOKEN=${TOKEN:-}" >&2\n'
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            env={**env, **({"TOKEN": token} if token else {})},
            capture_output=True,
            text=True,
            timeout=60,
        )

        assert result.returncode == 0, (snippet, result.stderr)
        kept = re.findall(r"^__TOKEN=(\S+)$", result.stderr, re.MULTILINE)
        if kept:
            token = kept[-1]
        for answer in json_documents(result.stdout):
            assert "errors" not in answer, (snippet, answer)
            if "token" in answer:
                token = answer["token"]
            if "/api/v1/jobs" in snippet and "id" in answer:
                job = Job.objects.get(pk=answer["id"])
                assert job.submitted_by.username == "nlp-member"

    assert token or ApiToken.objects.filter(user__username="nlp-member").exists(), (
        "no example made a token"
    )
    assert Job.objects.count() > jobs_before, "no example submitted a job"


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_the_readme_first_job_runs_as_written_against_the_demo(demo, live_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_URL=live_server.url, SLUICE_CONFIG=str(tmp_path / "config.json"))
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_first_job()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, (result.stdout, result.stderr)
    job = Job.objects.get(name="hello")
    assert job.submitted_by.username == "nlp-member"
    assert (job.queue.name, job.gpus_per_node) == ("train", 2)
    assert "hello" in result.stdout  # sluice ls lists it
