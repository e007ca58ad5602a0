"""The submit serializer's fields are made and bound once and shared by every serializer
of the class (scheduling.api.serializers.JobSubmitChecks): what it validates and refuses
is what a serializer with fields of its own validates and refuses."""

import threading

from rest_framework import serializers

from scheduling.api.serializers import JobBulkSerializer, JobSubmitSerializer


class OwnFields(JobSubmitSerializer):
    """The same declared fields, copied and bound for each serializer as DRF does."""

    @property
    def fields(self):
        return serializers.Serializer.fields.func(self)


GOOD = {
    "project": 1,
    "queue": 2,
    "workload_type": "training",
    "command": ["python", "train.py"],
    "env": {"A": "1"},
    "gpu_model": "H100-80GB",
}
BAD = {
    "project": "x",
    "queue": 2,
    "workload_type": "cooking",
    "command": ["python"],
    "env": {"A": 1},
    "gpus_per_node": -1,
    "gpu_models": ["H100-80GB"],
}


def _outcome(serializer_class, data):
    serializer = serializer_class(data=data)
    valid = serializer.is_valid()
    return valid, dict(serializer.validated_data) if valid else serializer.errors


def test_the_fields_are_shared_and_bound_once():
    first, second = JobSubmitSerializer(data=GOOD), JobSubmitSerializer(data=BAD)
    assert first.fields is second.fields
    assert first.fields["command"] is second.fields["command"]
    assert OwnFields(data=GOOD).fields is not OwnFields(data=GOOD).fields
    assert list(first.fields) == list(OwnFields().fields)


def test_shared_fields_validate_and_refuse_as_fields_of_its_own():
    for data in (GOOD, BAD, {**GOOD, "gpu_model": ""}, {}, {**GOOD, "env": "A=1"}):
        assert _outcome(JobSubmitSerializer, data) == _outcome(OwnFields, data), data
    valid, errors = _outcome(JobSubmitSerializer, BAD)
    assert not valid
    assert set(errors) == {"project", "workload_type", "env", "gpus_per_node", "gpu_models"}
    # Defaults are fresh objects, never one shared between submissions.
    _, one = _outcome(JobSubmitSerializer, GOOD)
    _, two = _outcome(JobSubmitSerializer, GOOD)
    assert one["labels"] == {} and one["labels"] is not two["labels"]


def test_a_bulk_refuses_each_item_as_one_submission_would():
    valid, errors = _outcome(JobBulkSerializer, {"jobs": [GOOD, BAD]})
    assert not valid
    assert list(errors["jobs"]) == [1]  # only the bad item is named
    assert errors["jobs"][1] == _outcome(OwnFields, BAD)[1]


def test_a_partial_serializer_gets_fields_of_its_own():
    partial = JobSubmitSerializer(data={"name": "x"}, partial=True)
    assert partial.fields is not JobSubmitSerializer(data=GOOD).fields
    assert partial.is_valid(), partial.errors


def test_threads_validating_at_once_get_each_their_own_answer():
    answers: dict[int, tuple] = {}
    barrier = threading.Barrier(4)

    def validate(i):
        barrier.wait()
        for _ in range(50):
            data = GOOD if i % 2 else BAD
            outcome = _outcome(JobSubmitSerializer, {**data, "name": f"job-{i}"})
            assert outcome[0] is bool(i % 2)
            if outcome[0]:
                assert outcome[1]["name"] == f"job-{i}"
        answers[i] = outcome

    threads = [threading.Thread(target=validate, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(answers) == [0, 1, 2, 3]
