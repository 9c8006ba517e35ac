"""Files: writing one (or a whole directory) so that a reader, or a crash, never sees half of it; checking an
output directory before any heavy work; hashing a file; reading a file a config key names (bounded: a regular
file of at most a stated size, never a device or a FIFO). Every way each can fail is a one-line error."""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

from .errors import ConfigError, UsageError
from .lock import HeldLock, exclusive_lock

# Errors of writing that the user fixes (space, permissions, the file system), as opposed to bugs.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


# What a config-like file may weigh: a config YAML, a config.json, a hardware profile, a dataset's meta.json are a
# few KB (a sharded dataset's meta.json lists its shards: ~40 bytes each). A file past this is not one of them,
# and reading it whole (a sparse file, a log given by mistake) would hold the process for nothing.
MAX_CONFIG_BYTES = 16 * 1024**2
_KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
}


class UnreadableFile(OSError):
    """A file `read_bounded` does not read: not a regular file, or over its size cap. An OSError, so each
    caller's handling of a file it cannot read (often: go on without it) applies unchanged."""


def read_bounded(path: str | Path, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of the regular file `path`, which may hold at most `limit`: the one way a file a config names is
    read whole. The type is checked before opening (opening a device can act on it) and again on what was opened
    (a FIFO swapped in meanwhile: O_NONBLOCK, so the open itself cannot wait for a writer); at most `limit` + 1
    bytes are read whatever the file claims. Raises OSError: FileNotFoundError, IsADirectoryError, ... as
    open() does, UnreadableFile for a device, FIFO, socket or a file over `limit`."""
    if "\0" in os.fspath(path):  # os.stat would raise ValueError, which callers of a read do not expect
        raise UnreadableFile(errno.EINVAL, "a path with a NUL character", str(path))
    _check_regular(os.stat(path), path, limit)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        _check_regular(os.fstat(fd), path, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFile(errno.EFBIG, f"over the {limit // 1024**2} MiB a config file may hold", str(path))
    return data


def _check_regular(st: os.stat_result, path: str | Path, limit: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
        raise UnreadableFile(errno.EINVAL, f"{kind}, not a regular file", str(path))
    if st.st_size > limit:
        raise UnreadableFile(
            errno.EFBIG, f"{st.st_size:,} bytes, over the {limit // 1024**2} MiB a config file may hold", str(path)
        )


class NotAConfig(ValueError):
    """JSON that json.loads cannot hold: nested past its recursion (100,000 [) or a number of more digits than
    Python converts (4,300)."""


def parse_json(data: bytes) -> Any:
    """JSON from UTF-8 bytes, the one parse of the config-like JSON a user gives (a file, a pasted config.json).
    Raises ValueError: UnicodeDecodeError, json.JSONDecodeError, or NotAConfig, never a RecursionError."""
    text = data.decode("utf-8-sig")  # a byte-order mark is no part of the text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise NotAConfig("nested too deeply") from None
    except ValueError:  # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        raise NotAConfig("a number of more digits than Python reads") from None


def json_file(path: str | Path, limit: int = MAX_CONFIG_BYTES) -> Any:
    """The JSON in the regular file `path`, read by `read_bounded`: its OSErrors, and parse_json's ValueErrors."""
    return parse_json(read_bounded(path, limit))


def read_json(path: Path, key: str, fix: str) -> Any:
    """The JSON in `path`, which config key `key` names; ConfigError (naming key, path and `fix`) when it is
    missing, a directory, not a regular file, too large, unreadable, not UTF-8, not JSON or nested too deeply.
    A UTF-8 byte-order mark before the JSON (Windows editors write one) is skipped: it is no part of the text."""
    try:
        return json_file(path)
    except FileNotFoundError:
        raise ConfigError(f"{key}: no such file {path}; {fix}") from None
    except IsADirectoryError:
        raise ConfigError(f"{key}: {path} is a directory; give the JSON file, or {fix}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path} is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except NotAConfig as e:
        raise ConfigError(f"{key}: {path} is not a config ({e}); {fix}") from None
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path} ({e.strerror}); {fix}") from None


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to a temporary file beside `path`, then rename it over `path` (atomic on POSIX).
    On any error the old file, if there was one, is left as it was and the temporary file is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # ATOMIC_TEMP matches it
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# write_atomic's temporary file: what a writer killed between its write and its rename leaves beside `path`.
ATOMIC_TEMP = re.compile(r"\.(?P<name>.+)\.\d+\.tmp")


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes (hex), read in 4 MiB blocks: any size in constant memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def display_path(path: str | Path) -> str:
    """A path as text that can always be printed and stored in UTF-8 JSON: a file name that is not valid
    UTF-8 (Latin-1 bytes, say) shows its odd bytes as \\xNN instead of failing the write."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def check_output_dir(path: str | Path, flag: str) -> Path:
    """`path` as a directory to create or replace, checked before any heavy work: a file in the way, a name
    longer than the file system allows, a read-only file system, an immutable or unwritable directory are
    each a one-line UsageError naming `flag`. Creates nothing (a probe file is written and removed)."""
    path = Path(path)
    absolute = Path(os.path.abspath(path))
    where = f"{flag} {display_path(path)}"
    existing = next(p for p in (absolute, *absolute.parents) if os.path.exists(p))  # False for a name too long
    if not existing.is_dir():
        at = "" if existing == absolute else f": {display_path(existing)}"
        raise UsageError(f"{where}{at} is a file, not a directory; give a directory path (created if missing)")
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for part in absolute.relative_to(existing).parts:
        if len(os.fsencode(part)) > name_max:
            raise UsageError(
                f"{where}: the name {display_path(part)[:32]}... ({len(os.fsencode(part))} bytes) is "
                f"longer than the file system allows ({name_max} bytes); give a shorter name"
            )
    # An existing directory is written into and renamed (replaced): its parent must be writable too.
    for folder in (absolute.parent, absolute) if existing == absolute else (existing,):
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".pretrain-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise UsageError(
                f"{where}: cannot write in {display_path(folder)} ({e.strerror}); give a directory you can write to"
            ) from None
    return path


def write_error(
    e: OSError,
    where: str,
    what: str,
    kept: str = "nothing was changed (free space or fix the permissions, then run again)",
) -> UsageError | None:
    """A one-line UsageError for a write that failed for a reason the user fixes (disk full, read-only,
    permissions), saying what is `kept`; None for any other error (a bug, to be shown as one)."""
    if e.errno not in WRITE_ERRNOS:
        return None
    return UsageError(f"{where}: {e.strerror} while writing {what}; {kept}")


def hidden_prefix(final: Path) -> str:
    """The name our temporary, aside and lock files beside `final` start with: ".NAME" (a long NAME cut so our
    suffixes still fit a file name's 255 bytes). StagedDirectory finds the leftovers of killed builds by it."""
    name = final.name
    return "." + (name if len(os.fsencode(name)) <= 100 else name[:50])


def writer_lock(final: Path, flag: str) -> HeldLock:
    """One writer of the directory `final` at a time, whichever command writes it (a plain `prepare` or a
    `prepare --tasks` launcher): the lock `.NAME.lock` beside it (lock.py: released when its holder ends in
    any way; the file stays and then means nothing)."""
    return exclusive_lock(
        final.with_name(f"{hidden_prefix(final)}.lock"),
        f"{flag} {display_path(final)}",
        "another `pretrain prepare` is building it: wait for it to end or stop it",
    )


def refuse_foreign(final: Path, flag: str, ours: tuple[str, ...]) -> None:
    """A one-line UsageError when the existing directory `final` holds a name that is not one of `ours`, nor
    write_atomic's temporary file of one of ours (ATOMIC_TEMP): replacing `final` would delete what a user
    keeps there. Any other name is foreign, whatever it ends with (a user's draft.tmp, a backup.tmp/)."""
    if not final.is_dir():
        return
    foreign = sorted(
        p.name
        for p in final.iterdir()
        if p.name not in ours and not ((m := ATOMIC_TEMP.fullmatch(p.name)) and m["name"] in ours)
    )
    if foreign:
        shown = ", ".join(map(display_path, foreign[:3])) + (" ..." if len(foreign) > 3 else "")
        raise UsageError(
            f"{flag} {display_path(final)} holds files this command did not write ({shown}); they "
            "would be lost when it is replaced: give a new or empty directory"
        )


def read_owned(marker: Path, fix: str) -> set[str]:
    """What a command's mark file lists as its own (JSON {"created": [...]}: what it wrote and may replace on its
    next run, as `pretrain demo` and `pretrain report` keep one in their --out); empty without one. A damaged
    mark is a one-line UsageError ending with `fix`."""
    try:
        return {str(name) for name in json_file(marker)["created"]} if marker.is_file() else set()
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{display_path(marker)} is damaged; {fix}") from None


def record_owned(marker: Path, names: set[str]) -> None:
    """Write the mark `read_owned` reads: before the files it names are written, so a crash between leaves a
    claim on a name still missing (harmless), never one of ours unclaimed."""
    write_atomic(marker, json.dumps({"created": sorted(names)}, indent=2) + "\n")


def aside_path(final: Path) -> Path:
    """Where `swap_in` puts the directory it replaces, under this process's name."""
    return final.with_name(f"{hidden_prefix(final)}.{os.getpid()}.old")


def swap_in(new: Path, final: Path, aside: Path) -> None:
    """Put the finished directory `new` at `final`: an existing `final` renamed to `aside` first, `new` renamed
    into place (each a rename within one directory: atomic), then the old one deleted. A failed rename puts the
    old one back; a crash between the two renames leaves it whole under `aside`."""
    old = None
    if final.exists():
        os.rename(final, aside)
        old = aside
    try:
        os.rename(new, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class StagedDirectory:
    """A directory built under a temporary name beside its final path and swapped in by `commit` only when
    complete: until then the previous directory at that path stays whole and usable, whatever stops the
    build (an error, Ctrl-C, SIGTERM, SIGKILL, a full disk). Used as a context manager: leaving it without
    `commit` removes the temporary directory.

    A build killed outright (SIGKILL) leaves its temporary directory; the next build of the same path on
    this host removes it, once the process that made it is gone. Only `replaceable` names may be in an
    existing final directory: whatever else a user keeps there is never deleted by a swap (refused instead).
    One build of a path at a time (writer_lock, held from the checks to the end): a second is refused.
    """

    def __init__(self, final: str | Path, flag: str, replaceable: tuple[str, ...]):
        # The real directory, symlinks followed: a link to a dataset keeps pointing at the new one, and `--out .`
        # has a name to build beside.
        self.final = Path(os.path.realpath(final))
        self.flag = flag
        name = self.final.name
        if not name:
            raise UsageError(
                f"{flag} {display_path(final)}: the root directory cannot be replaced; give a directory below it"
            )
        self._prefix = hidden_prefix(self.final)
        self.path = self.final.with_name(f"{self._prefix}.{os.getpid()}.tmp")
        self._aside = aside_path(self.final)
        self._replaceable = replaceable
        self._committed = False

    def __enter__(self) -> StagedDirectory:
        check_output_dir(self.final, self.flag)
        self._lock = writer_lock(self.final, self.flag)  # held until __exit__
        try:
            refuse_foreign(self.final, self.flag, self._replaceable)
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
            self.path.mkdir()
            (self.path / ".owner").write_text(f"{socket.gethostname()} {os.getpid()}\n")
        except OSError as e:  # a disk that filled up since the check: one line, and no half-made directory
            self.__exit__()
            error = write_error(e, f"{self.flag} {display_path(self.final)}", "its temporary directory")
            if error is None:
                raise
            raise error from None
        except BaseException:
            self.__exit__()
            raise
        return self

    def commit(self) -> None:
        """Swap the finished directory in: the old one is renamed aside, the new one renamed into place
        (each a rename within one directory: atomic), then the old one is deleted."""
        (self.path / ".owner").unlink()
        swap_in(self.path, self.final, self._aside)
        self._committed = True

    def __exit__(self, *exc: object) -> None:  # None: an exception passes on
        if not self._committed:
            shutil.rmtree(self.path, ignore_errors=True)
        self._lock.release()

    def _remove_leftovers(self) -> None:
        """Temporary directories of earlier builds of this path killed outright, by a process of this host that
        is gone: a half-built one is deleted; an old one renamed aside just before a swap is put back if the
        swap never happened."""
        host = socket.gethostname()
        for leftover in self.final.parent.glob(f"{glob.escape(self._prefix)}.*"):
            suffix = leftover.name[len(self._prefix) + 1 :]
            pid, _, kind = suffix.partition(".")
            if not (pid.isdigit() and kind in ("tmp", "old") and leftover.is_dir()) or int(pid) == os.getpid():
                continue
            owner = leftover / ".owner"
            if kind == "tmp" and owner.is_file():
                owner_host, _, owner_pid = owner.read_text().strip().partition(" ")
                if owner_host != host or _alive(int(owner_pid or 0)):
                    continue  # another host's build on a shared file system, or still running
            elif _alive(int(pid)):
                continue
            if kind == "old" and not self.final.exists():
                os.rename(leftover, self.final)
            else:
                shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
