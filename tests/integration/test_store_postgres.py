"""The store's and the state machine's tests again, on a real PostgreSQL server.

The unit run gives them a SQLite file; here ``store_url`` (tests/integration/conftest.py)
is a fresh schema of the session's PostgreSQL, so the SQL both dialects must agree on
(upserts, ON CONFLICT, compare-and-set under concurrency, migrations) runs on both.
"""

from tests.unit.service.test_leadership import *  # noqa: F403
from tests.unit.service.test_replicas import *  # noqa: F403
from tests.unit.service.test_states import *  # noqa: F403 - the same tests, another database
from tests.unit.service.test_store import *  # noqa: F403
