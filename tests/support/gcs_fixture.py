"""A real GCS JSON API endpoint on loopback for the tests: gcp-storage-emulator, in-process.

Objects live in memory; the bucket exists, any other bucket name does not. The
emulator checks no credentials, and etrain sends none to a plain-http endpoint,
so refused credentials and missing grants cannot be tested against it.

Two things real GCS has and the emulator lacks, and what is done about them:

- The Storage Control gRPC API. gcsfs's default client asks it for every
  bucket's type (zonal, hierarchical) and retries for about a minute when it
  gets no answer, so importing this module sets
  ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (read once, when gcsfs is first
  imported; conftest imports this module before any test does): gcsfs's plain
  JSON API client is what these tests run.
- ``objects.move`` (``POST .../o/SRC/moveTo/o/DST``), which gcsfs's rename tries
  first (DCP renames ``.metadata.tmp``). The emulator answers 501, which gcsfs
  retries for about 30 s before it falls back to copy and delete; the fixture
  adds the route, done as the emulator's own copy then delete of the source.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

import pytest

BUCKET = "etrain-test"


def _move(request, response, storage) -> None:
    """``objects.move`` within one bucket: the emulator's copy, then delete of the source."""
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    bucket, source, dest = (
        request.params[k] for k in ("bucket_name", "object_id", "dest_object_id")
    )
    try:
        moved = objects._copy(request.base_url, storage, bucket, source, bucket, dest)
        storage.delete_file(bucket, source)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    response.json(moved)


@pytest.fixture(scope="session")
def gcs_server():
    """Start the emulator on 127.0.0.1 (a free port) with bucket ``etrain-test``; yield
    ``{"endpoint_url", "bucket"}``. Nothing is put in ``os.environ`` but the gcsfs switch
    above; tests name the endpoint in ``stores.gcs.endpoint_url``."""
    from gcp_storage_emulator import server as emulator
    from gcp_storage_emulator import settings

    # It logs every request at INFO; keep its warnings (unimplemented methods) and errors.
    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    api = rf"^{settings.API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)"
    routes = emulator.HANDLERS
    emulator.HANDLERS = (
        (rf"{api}/moveTo/o/(?P<dest_object_id>.*[^/]+)$", {"POST": _move}),
        *routes,
    )
    server = emulator.create_server("127.0.0.1", 0, in_memory=True, default_bucket=BUCKET)
    server.start()
    try:
        port = server._api._httpd.server_port  # the port 0 was bound to (version pinned)
        yield {"endpoint_url": f"http://127.0.0.1:{port}", "bucket": BUCKET}
    finally:
        server.stop()
        emulator.HANDLERS = routes
