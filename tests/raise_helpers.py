"""Helpers shared by the priority-raise tests."""

from scheduling.services.raises import priority_raise_request


def ask(world, job, to_class=None, *, user=None, reason="release candidate for the demo", **kw):
    """The member (or ``user``) asks for ``to_class`` (default high) for ``job``."""
    return priority_raise_request(
        user=user or world.member, job=job, to_class=to_class or world.high, reason=reason, **kw
    )
