"""Local files opened beneath the roots a tenant may use, checked at the moment of use.

The service checks every place a spec names when the job is submitted; what holds is
this check, made by the process that opens the file, on its node, when it opens it.
A path is opened one component at a time from a root directory's descriptor
(``os.open(name, dir_fd=..., O_NOFOLLOW)``), the semantics of Linux
``openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)``, which Python does not bind:

- a symbolic link is followed only when its target stays beneath an allowed root (a
  relative target resolved from where the link is; an absolute one must lie under a
  root); ``..`` never climbs above the root the walk started from;
- a component swapped for a link between the look and the open is caught by
  ``O_NOFOLLOW`` (the walk looks again, at most a few times);
- only regular files and directories are opened: a named pipe, a device or a socket is
  refused before it is opened, and again after (``fstat`` of what was opened);
- every read is bounded: :func:`read_bounded` refuses a file larger than its cap
  before reading a byte and reads at most the cap.

Names read out of files (a weight map's shard names, an index's file names) go
through :func:`child_name` first: relative, no ``..``, no NUL, then the same walk.

Which roots a job may use is written by the service into the job's environment
(:data:`ROOTS_ENV`, JSON ``{"read": [...], "write": [...]}``); a spec cannot set it.
The service builds the same :class:`Roots` from its access policy for the reads it
makes at submit and plan. A process with no roots in its environment (the CLI run by
a user on their own files, a test) is :data:`UNCONFINED`: it still refuses pipes,
devices and oversized reads, but not places.

Torch-free: the service imports it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

ROOTS_ENV = "ETRAIN_STORAGE_ROOTS"
MAX_LINK_HOPS = 40  # as Linux's path walk
_RETRIES = 8  # a component changed between the look and the open: look again
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ConfinementError(PermissionError):
    """A path a job may not open: outside its roots, a link out of them, or not a regular
    file or folder. The message names the path as given and the rule, never what lies at
    a link's target."""


@dataclass(frozen=True)
class Roots:
    """The folders a process may read beneath and those it may write beneath.

    Every root is an absolute, normalized path. ``confined`` False means no place is
    refused (the rest of the checks still apply).
    """

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    confined: bool = True

    @classmethod
    def of(cls, read, write=()) -> Roots:
        """Roots from lists of paths: each made absolute and normalized, and also with the
        links in the root itself resolved (the operator's choice of folder, not a tenant's:
        a spec may name it either way), the write roots also readable."""
        w = tuple(dict.fromkeys(r for p in write for r in _root(p)))
        r = tuple(dict.fromkeys([*(r for p in read for r in _root(p)), *w]))
        return cls(read=r, write=w)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Roots:
        """The roots the service wrote into this job's environment, else :data:`UNCONFINED`."""
        raw = (os.environ if env is None else env).get(ROOTS_ENV)
        if not raw:
            return UNCONFINED
        try:
            data = json.loads(raw)
            return cls.of(data.get("read", []), data.get("write", []))
        except (ValueError, AttributeError, TypeError) as e:
            raise ConfinementError(f"{ROOTS_ENV} is not valid ({e}); it is the service's") from e

    def env(self) -> dict[str, str]:
        """``{ROOTS_ENV: json}`` for a job's environment (empty when unconfined)."""
        if not self.confined:
            return {}
        return {ROOTS_ENV: json.dumps({"read": list(self.read), "write": list(self.write)})}

    def allows(self, path: str, *, write: bool = False) -> bool:
        """Whether ``path`` (lexically) lies beneath a root; links are the walk's to judge."""
        return not self.confined or _root_of(_abs(path), self.write if write else self.read)


UNCONFINED = Roots(confined=False)


def _root(path) -> tuple[str, ...]:
    given = posixpath.normpath(os.path.abspath(os.path.expanduser(str(path))))
    return (given, os.path.realpath(given))


def _abs(path: str) -> str:
    """``path`` (``file://`` allowed) as an absolute, lexically normalized path."""
    path = str(path)
    if "\x00" in path:
        raise ConfinementError(f"{path!r}: a path may not hold a NUL byte")
    path = path.removeprefix("file://")
    if not path.startswith("/"):
        raise ConfinementError(f"{path}: only absolute paths are opened")
    return posixpath.normpath(path)


def _root_of(path: str, roots: tuple[str, ...]) -> str | None:
    """The longest root ``path`` lies beneath (or is), else None."""
    best = None
    for root in roots:
        if (path == root or path.startswith(root.rstrip("/") + "/")) and (
            best is None or len(root) > len(best)
        ):
            best = root
    return best


def _parts(rel: str) -> list[str]:
    return [p for p in rel.split("/") if p not in ("", ".")]


def child_name(name: object, *, where: str) -> str:
    """``name`` read out of a file (``where`` says which, for the message), checked to be a
    relative path below the folder that file is in: a string, not absolute, no ``..``, no
    NUL or backslash."""
    if not isinstance(name, str) or not name:
        raise ConfinementError(f"{where}: {name!r} is not a file name")
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or "\x00" in name or "\\" in name:
        raise ConfinementError(
            f"{where}: {name!r} must name a file inside the folder (relative, no '..')"
        )
    return name


class _Walk:
    """One walk from a root's descriptor; closes every descriptor it opened but the last."""

    def __init__(self, path: str, roots: Roots, *, write: bool):
        self.given = path
        self.path = _abs(path)
        self.allowed = roots.write if write else roots.read
        self.roots = roots
        self.hops = 0

    def refuse(self, why: str) -> ConfinementError:
        return ConfinementError(f"{self.given}: {why}")

    def start(self, path: str) -> tuple[str, list[str]]:
        """(root, components below it) of an absolute ``path``."""
        if not self.roots.confined:
            return "/", _parts(path)
        root = _root_of(path, self.allowed)
        if root is None:
            raise self.refuse("outside the folders this job may use")
        return root, _parts(path[len(root) :])

    def open(self, *, want_dir: bool) -> int:
        root, todo = self.start(self.path)
        stack = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        try:
            while todo:
                name = todo.pop(0)
                if name == "..":
                    if len(stack) == 1:
                        raise self.refuse("'..' would go outside the folders this job may use")
                    os.close(stack.pop())
                    continue
                last = not todo
                fd, link = self._step(stack[-1], name, directory=want_dir or not last)
                if link is not None:
                    self.hops += 1
                    if self.hops > MAX_LINK_HOPS:
                        raise self.refuse("too many symbolic links")
                    if link.startswith("/"):
                        for fd_ in stack:
                            os.close(fd_)
                        stack = []
                        root, rest = self.start(posixpath.normpath(link))
                        stack = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
                        todo = rest + todo
                    else:
                        todo = _parts(link) + todo
                    continue
                stack.append(fd)
            if len(stack) == 1:  # the root itself
                if not want_dir:
                    raise self.refuse("is a folder, not a file")
                return stack.pop()
            return stack.pop()
        finally:
            for fd_ in stack:
                os.close(fd_)

    def _step(self, dir_fd: int, name: str, *, directory: bool) -> tuple[int, str | None]:
        """Open ``name`` in ``dir_fd`` without following a link: (fd, None), or (-1, target)
        when ``name`` is a link."""
        for _ in range(_RETRIES):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise FileNotFoundError(
                    errno.ENOENT, "no such file or folder", self.given
                ) from None
            if stat.S_ISLNK(st.st_mode):
                try:
                    return -1, os.readlink(name, dir_fd=dir_fd)
                except OSError:
                    continue  # replaced meanwhile
            if directory and not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, f"{name!r} is not a folder", self.given)
            if not directory and stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, f"{name!r} is a folder", self.given)
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise self.refuse(f"{name!r} is {_kind(st.st_mode)}, not a regular file or folder")
            flags = _DIR_FLAGS if directory else os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
                    continue  # swapped for a link (or something else) after the look
                raise
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) and (
                stat.S_ISDIR(now.st_mode) or stat.S_ISREG(now.st_mode)
            ):
                if not directory:
                    os.set_blocking(fd, True)
                return fd, None
            os.close(fd)
        raise self.refuse("changed while it was being opened; try again")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def open_fd(path: str, roots: Roots, *, directory: bool = False, write: bool = False) -> int:
    """A descriptor (read-only) of the regular file, or folder, at ``path`` beneath ``roots``.

    ``write`` checks against the write roots (the descriptor is still read-only: writers
    use :func:`check_folder` and then the folder's path). Raises
    :class:`ConfinementError`, FileNotFoundError or NotADirectoryError.
    """
    return _Walk(path, roots, write=write).open(want_dir=directory)


@contextlib.contextmanager
def opened(path: str, roots: Roots) -> Iterator:
    """The regular file at ``path`` beneath ``roots``, open for binary reading."""
    with os.fdopen(open_fd(path, roots), "rb") as f:
        yield f


def read_bounded(path: str, roots: Roots, limit: int, *, what: str = "") -> bytes:
    """All of the regular file at ``path`` (beneath ``roots``), refused when it is larger
    than ``limit`` bytes, before a byte is read; ``what`` names it in the message."""
    with opened(path, roots) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ConfinementError(
                f"{what or path}: {size} bytes, over the {limit}-byte limit for this file"
            )
        data = f.read(limit + 1)
    if len(data) > limit:  # grew meanwhile
        raise ConfinementError(f"{what or path}: over the {limit}-byte limit for this file")
    return data


def proc_path(fd: int) -> str:
    """A path that opens exactly the file ``fd`` is open on, for libraries that take a path
    (safetensors, numpy's memory maps): ``/proc/self/fd/N``. It names the file already
    reached beneath the roots, whatever its name's components are now."""
    return f"/proc/self/fd/{fd}"


def check_folder(path: str, roots: Roots, *, write: bool = False, create: bool = False) -> str:
    """``path`` once its folder is known to lie beneath ``roots`` with no link in any
    component below the root (made, beneath the root, when ``create``); raises
    :class:`ConfinementError` otherwise. For the folders a job writes through a path
    (checkpoints, event files): called at each use, so a folder swapped for a link is
    refused at the next save, restore or prune. Unconfined: ``path`` as it is."""
    walk = _Walk(path, roots, write=write)
    if not roots.confined:
        if create:
            os.makedirs(walk.path, exist_ok=True)
        return walk.path
    root, parts = walk.start(walk.path)
    if create:  # the root itself is the operator's (a tenant's first job makes its area)
        os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts:
            if name == "..":
                raise walk.refuse("'..' is not allowed here")
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, "no such folder", path) from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise walk.refuse(f"{name!r} is a link or not a folder") from None
                raise
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
    return walk.path


def list_folder(path: str, roots: Roots) -> list[str]:
    """The names in the folder at ``path`` beneath ``roots``."""
    fd = open_fd(path, roots, directory=True)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def is_file(path: str, roots: Roots) -> bool:
    """Whether ``path`` is a regular file beneath ``roots``: False when nothing (or a folder)
    is there; a place the job may not open raises :class:`ConfinementError`."""
    try:
        os.close(open_fd(path, roots))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return False
    return True
