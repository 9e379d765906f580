"""What a Redis login may run: the one check the role tests share (tests/integration/
test_redis_roles.py against a bare Redis, tests/e2e/test_redis_roles_live.py on a cluster)."""

from __future__ import annotations

from typing import Any

import redis


def refused(client: redis.Redis, command: tuple[Any, ...]) -> bool:
    """Whether Redis refuses ``command`` to ``client``'s user for want of a permission
    (NOPERM); any other error propagates, so a command that fails for another reason
    cannot pass for a refused one. An allowed command runs."""
    try:
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    except redis.exceptions.NoPermissionError:
        return True
    return False
