"""A real S3 HTTP endpoint on loopback for the tests: moto's standalone server, in-process.

The server checks credentials like S3 does: after setup it only answers
requests signed with the access key the fixture created (IAM-backed, allowed
``s3:*``), so tests can see a wrong key or secret refused. The bucket exists;
any other bucket name does not.
"""

from __future__ import annotations

import json
import logging

import pytest

BUCKET = "etrain-test"
REGION = "us-east-1"
_ALLOW_S3 = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


@pytest.fixture(scope="session")
def s3_server():
    """Start moto's S3 server on 127.0.0.1 (a free port); yield how to reach it.

    Yields ``{"endpoint_url", "bucket", "region", "env"}`` where ``env`` holds
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_DEFAULT_REGION`` of
    a user the server accepts. Nothing is put in ``os.environ``: tests pass
    ``env`` on, or ``monkeypatch.setenv`` it.
    """
    import boto3
    import requests
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO on its own handler unless told otherwise, and
    # the server's own DEBUG records (it runs in this process) repeat signed headers.
    for name in ("werkzeug", "moto"):
        logging.getLogger(name).setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        setup = {
            "endpoint_url": endpoint,
            "region_name": REGION,
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="etrain-tests")
        iam.put_user_policy(
            UserName="etrain-tests", PolicyName="s3", PolicyDocument=json.dumps(_ALLOW_S3)
        )
        key = iam.create_access_key(UserName="etrain-tests")["AccessKey"]
        env = {
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": REGION,
        }
        server_info = {"endpoint_url": endpoint, "bucket": BUCKET, "region": REGION, "env": env}
        s3_client(server_info).create_bucket(Bucket=BUCKET)
        # From here on every request must be signed by a known key (moto's IAM check).
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
        yield server_info
    finally:
        server.stop()
        import moto.settings

        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")  # reset-auth is process-wide


def s3_client(server: dict):
    """A boto3 S3 client of :func:`s3_server`'s user (to put test objects in place)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server["endpoint_url"],
        region_name=server["region"],
        aws_access_key_id=server["env"]["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=server["env"]["AWS_SECRET_ACCESS_KEY"],
    )
