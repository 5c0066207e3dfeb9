"""Tokens on PostgreSQL: racing creators of one new tenant, listing, revoking, and the
configured admin token replacing the one before."""

from __future__ import annotations

import threading

import pytest

from service.auth import authenticate, create_user_token, ensure_admin_token
from service.errors import Unauthorized


def test_twenty_threads_create_the_first_tokens_of_one_tenant(stores):
    barrier, errors, tokens = threading.Barrier(20, timeout=30), [], []

    def create():
        barrier.wait()  # all at once, each in its own pooled connection
        try:
            tokens.append(create_user_token(stores.tokens, tenant="new-team", name="ci"))
        except Exception as e:  # noqa: BLE001 - the failure under test
            errors.append(e)

    threads = [threading.Thread(target=create) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(tokens)) == 20
    listed = stores.tokens.list_tokens()
    assert len(listed) == 20 and {tenant for _, tenant in listed} == {"new-team"}


def test_revoke_and_admin_replacement(stores, tmp_path):
    ensure_admin_token(stores.tokens, configured="et_pg-admin-one", data_dir=tmp_path)
    user = create_user_token(stores.tokens, tenant="acme", name="ci")
    ((record, tenant),) = [t for t in stores.tokens.list_tokens() if t[1] == "acme"]
    assert stores.tokens.revoke_token(record.id, tenant_id="t-someone-else") is None
    assert stores.tokens.revoke_token(record.id)[1] == tenant == "acme"
    with pytest.raises(Unauthorized):
        authenticate(stores.tokens, f"Bearer {user}")
    ensure_admin_token(stores.tokens, configured="et_pg-admin-two", data_dir=tmp_path)
    with pytest.raises(Unauthorized):
        authenticate(stores.tokens, "Bearer et_pg-admin-one")
    assert authenticate(stores.tokens, "Bearer et_pg-admin-two").role == "admin"
