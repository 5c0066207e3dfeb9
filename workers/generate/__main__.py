"""``python -m workers.generate``: one request on stdin, one JSON answer on stdout."""

import time

STARTED = time.monotonic()  # the request's time bound counts the imports below

from workers.generate.run import main  # noqa: E402

raise SystemExit(main(started=STARTED))
