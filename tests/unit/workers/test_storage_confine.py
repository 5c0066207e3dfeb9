"""The confined opener (workers/storage/confine.py) on real files, links, pipes and devices."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from workers.storage.confine import (
    ROOTS_ENV,
    UNCONFINED,
    ConfinementError,
    Roots,
    check_folder,
    child_name,
    is_file,
    list_folder,
    open_fd,
    opened,
    proc_path,
    read_bounded,
)


@pytest.fixture
def areas(tmp_path):
    """Tenant a's and tenant b's folders; ``roots`` is a's."""
    a, b = tmp_path / "tenants" / "a", tmp_path / "tenants" / "b"
    (a / "m").mkdir(parents=True)
    (b / "m").mkdir(parents=True)
    (a / "m" / "config.json").write_text('{"mine": 1}')
    (b / "m" / "config.json").write_text('{"secret": "b"}')
    ck = tmp_path / "checkpoints" / "a"
    ck.mkdir(parents=True)
    return a, b, ck, Roots.of([a], [ck])


def _read(path, roots):
    with opened(str(path), roots) as f:
        return f.read()


def test_a_file_beneath_a_root_opens_and_links_inside_are_followed(areas):
    a, _, _, roots = areas
    (a / "inner").symlink_to("m/config.json")
    (a / "m" / "up").symlink_to("../m/config.json")
    (a / "absolute").symlink_to(a / "m" / "config.json")
    for name in ("m/config.json", "inner", "m/up", "absolute", "m/../m/config.json"):
        assert _read(a / name, roots) == b'{"mine": 1}'


@pytest.mark.parametrize(
    "make",
    [
        lambda a, b: (a / "link").symlink_to(b / "m" / "config.json"),  # absolute, out
        lambda a, b: (a / "link").symlink_to("../b/m/config.json"),  # relative, out
        lambda a, b: (a / "link").symlink_to("/proc/self/root" + str(b / "m" / "config.json")),
        lambda a, b: (a / "dir").symlink_to(b / "m") or None,  # a folder link, then a file
    ],
    ids=["absolute-out", "relative-out", "magic-link", "folder-out"],
)
def test_a_link_that_leaves_the_roots_is_refused_and_says_nothing_of_its_target(areas, make):
    a, b, _, roots = areas
    make(a, b)
    name = "link" if (a / "link").is_symlink() else "dir/config.json"
    with pytest.raises(ConfinementError) as e:
        _read(a / name, roots)
    assert "secret" not in str(e.value) and "outside" in str(e.value)


def test_dotdot_cannot_climb_above_the_root(areas):
    a, _, _, roots = areas
    with pytest.raises(ConfinementError):
        _read(f"{a}/m/../../b/m/config.json", roots)
    (a / "m" / "esc").symlink_to("../../b/m/config.json")
    with pytest.raises(ConfinementError, match=r"'\.\.' would go outside"):
        _read(a / "m" / "esc", roots)


def test_a_named_pipe_is_refused_without_blocking(areas):
    a, _, _, roots = areas
    os.mkfifo(a / "index.json")
    with pytest.raises(ConfinementError, match="named pipe"):
        read_bounded(str(a / "index.json"), roots, 1 << 20)
    # a link to a pipe inside the root: refused too
    (a / "p").symlink_to("index.json")
    with pytest.raises(ConfinementError, match="named pipe"):
        _read(a / "p", roots)


def test_devices_and_sockets_are_refused_even_unconfined(tmp_path):
    with pytest.raises(ConfinementError, match="device"):
        _read("/dev/zero", UNCONFINED)
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    try:
        with pytest.raises(ConfinementError, match="socket"):
            _read(tmp_path / "sock", UNCONFINED)
    finally:
        s.close()


def test_reads_are_bounded_before_a_byte_is_read(areas):
    a, _, _, roots = areas
    big = a / "big.json"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB for free
    with pytest.raises(ConfinementError, match="over the 1024-byte limit"):
        read_bounded(str(big), roots, 1024, what="index.json")
    assert read_bounded(str(a / "m" / "config.json"), roots, 1024) == b'{"mine": 1}'


def test_outside_every_root_and_relative_and_nul_are_refused(areas):
    a, b, _, roots = areas
    for path in (b / "m" / "config.json", "/etc/passwd", "m/config.json", f"{a}/m\x00/x"):
        with pytest.raises(ConfinementError):
            open_fd(str(path), roots)


def test_write_roots_are_separate_from_read_roots(areas):
    a, _, ck, roots = areas
    shutil.rmtree(ck)  # a tenant's first job makes its (operator-named) area
    assert check_folder(str(ck / "job" / "run"), roots, write=True, create=True)
    assert (ck / "job" / "run").is_dir()
    with pytest.raises(ConfinementError):
        check_folder(str(a / "m"), roots, write=True)
    # a checkpoint folder swapped for a link (even to inside the same root) is refused
    (ck / "job2").symlink_to(ck / "job")
    with pytest.raises(ConfinementError, match="link"):
        check_folder(str(ck / "job2" / "run"), roots, write=True, create=True)


def test_names_read_out_of_files_are_relative_and_stay_below(areas):
    assert child_name("model-00001-of-00002.safetensors", where="w") == (
        "model-00001-of-00002.safetensors"
    )
    assert child_name("sub/x.bin", where="w") == "sub/x.bin"
    for bad in ("/abs/x", "../b/x", "a/../../x", "", None, 3, "x\x00", "a\\..\\b"):
        with pytest.raises(ConfinementError):
            child_name(bad, where="weight_map")


def test_proc_path_reopens_the_same_file_not_the_name(areas):
    a, _, _, roots = areas
    fd = open_fd(str(a / "m" / "config.json"), roots)
    try:
        os.rename(a / "m" / "config.json", a / "m" / "moved.json")
        (a / "m" / "config.json").symlink_to("/etc/hostname")
        with open(proc_path(fd), "rb") as f:
            assert f.read() == b'{"mine": 1}'
    finally:
        os.close(fd)


def test_listing_and_is_file(areas):
    a, b, _, roots = areas
    assert list_folder(str(a / "m"), roots) == ["config.json"]
    assert is_file(str(a / "m" / "config.json"), roots)
    assert not is_file(str(a / "m" / "nothing"), roots)
    assert not is_file(str(a / "m"), roots)
    (a / "out").symlink_to(b / "m" / "config.json")
    with pytest.raises(ConfinementError):
        is_file(str(a / "out"), roots)


def test_roots_travel_in_the_environment_and_unset_means_unconfined(areas):
    *_, roots = areas
    env = roots.env()
    assert json.loads(env[ROOTS_ENV])["write"] == list(roots.write)
    assert Roots.from_env(env) == roots
    assert Roots.from_env({}) is UNCONFINED and UNCONFINED.env() == {}
    with pytest.raises(ConfinementError, match=ROOTS_ENV):
        Roots.from_env({ROOTS_ENV: "[1"})
