"""``make test`` runs the tests marked ``no_ray`` beside the Ray tests (tests/run_beside.sh);
the collection hook of tests/conftest.py refuses a ``no_ray`` test that asks for a Ray
fixture, so a mislabelled test cannot start a second Ray cluster beside the first."""

from __future__ import annotations

import pytest

from tests.conftest import RAY_FIXTURES

pytest_plugins = ["pytester"]

_TEST = """
import pytest

@pytest.mark.no_ray
def test_marked({fixture}):
    pass

def test_unmarked({fixture}):
    pass
"""


def _collect(pytester: pytest.Pytester, fixture: str, test: str) -> pytest.RunResult:
    pytester.makeini("[pytest]\nmarkers =\n    no_ray: beside the Ray tests\n")
    pytester.makeconftest(
        "import pytest\n"
        "from tests.conftest import pytest_collection_modifyitems  # the hook under test\n"
        f"@pytest.fixture\ndef {fixture}():\n    return None\n"
    )
    pytester.makepyfile(test_split=test.format(fixture=fixture))
    return pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider")


@pytest.mark.parametrize("fixture", sorted(RAY_FIXTURES))
def test_a_no_ray_test_that_asks_for_a_ray_fixture_is_refused(pytester, fixture):
    result = _collect(pytester, fixture, _TEST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"test_marked is marked no_ray but uses ['{fixture}']" in result.stderr.str()
    assert "test_unmarked" not in result.stderr.str()


def test_other_fixtures_and_unmarked_tests_collect(pytester):
    result = _collect(pytester, "tmp_store", _TEST)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*test_marked*", "*test_unmarked*"])
