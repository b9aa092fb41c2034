"""Runtimes for another architecture, assembled offline from the registries, for QEMU.

Owns preparing one (`prepare_runtime`): Debian's packages of the architecture's Python and the
libraries it and onnxruntime load (``apt-get download`` under a private apt state, so the
machine's own apt configuration and package list are left alone; ``dpkg-deb -x``), and PyPI's
wheels of onnxruntime, pinned to the class's version, and numpy (``pip download --platform``);
the ``runtime.json`` that records every downloaded piece with its digest and a digest of the
whole assembled tree (`schemas.emulation.PreparedRuntime`); finding a prepared one for a class
(`find_runtime`) and checking the tree against its digest before every use (`verify_runtime`).
Only `prepare_runtime` downloads, and only ``qualify emulators prepare`` calls it. Does not run
QEMU (`qualify.measure.emulators`).

More: docs/internals.md, ``qualify.measure.sysroot``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from qualify.errors import QualifyError
from schemas.atomic import read_bounded, remove_leftovers, temp_prefix, write_atomic
from schemas.emulation import CPU_MODELS, PreparedPiece, PreparedRuntime
from schemas.project import RuntimeSpec

__all__ = [
    "DEBIAN_PACKAGES",
    "FOREIGN",
    "SysrootError",
    "emulator_dirs",
    "find_runtime",
    "prepare_runtime",
    "runtimes_in",
    "tree_digest",
    "user_emulator_dir",
    "verify_runtime",
]

FOREIGN: dict[str, tuple[str, str]] = {"aarch64": ("arm64", "manylinux_2_28_aarch64")}
"""Architecture -> (Debian's name for it, the wheel platform tag): the architectures a runtime
can be prepared for (only ARM is tried and tested; an x86 class on an ARM host is not)."""

DEBIAN_SUITE = "bookworm"
"""Debian 12: its Python is 3.11, the oldest onnxruntime's wheels still serve."""
PYTHON = "3.11"
DEBIAN_PACKAGES = (
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "zlib1g",
    "libexpat1",
    "libffi8",
    "libssl3",
)
"""What the interpreter, numpy and onnxruntime load, and nothing else."""
_SOURCES = (
    "deb [signed-by={key}] http://deb.debian.org/debian {suite} main\n"
    "deb [signed-by={key}] http://deb.debian.org/debian {suite}-updates main\n"
    "deb [signed-by={key}] http://deb.debian.org/debian-security {suite}-security main\n"
)
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
_UNUSED = ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/lintian")
_MAX_RUNTIME_JSON = 1 << 20
_STEP_TIMEOUT_S = 900.0


class SysrootError(QualifyError):
    """A runtime for another architecture cannot be prepared, or a prepared one is unusable."""


def user_emulator_dir() -> Path:
    """Where prepared runtimes live by default: ``$QUALIFY_EMULATORS``, else
    ``$XDG_CACHE_HOME/qualify/emulators`` (``~/.cache/qualify/emulators``)."""
    explicit = os.environ.get("QUALIFY_EMULATORS")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "qualify" / "emulators"


def emulator_dirs(db_dir: Path) -> tuple[Path, ...]:
    """Where a run looks for prepared runtimes, first to last: beside the matrix
    (``<matrix folder>/emulators``), then the user's (`user_emulator_dir`)."""
    return (db_dir / "emulators", user_emulator_dir())


def _name(arch: str, version: str) -> str:
    return f"{arch}-onnxruntime-{version}"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


def _read_runtime(path: Path) -> PreparedRuntime:
    where = path / "runtime.json"
    try:
        return PreparedRuntime.model_validate_json(read_bounded(where, _MAX_RUNTIME_JSON))
    except (OSError, ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0][:300]
        raise SysrootError(
            f"{where}: not a runtime qualify prepared ({first}). Fix: remove {path} and run "
            "qualify emulators prepare again."
        ) from None


def runtimes_in(folder: Path, arch: str) -> list[tuple[Path, PreparedRuntime]]:
    """The runtimes prepared for ``arch`` in one emulators folder, by folder name.

    Raises:
        SysrootError: a folder that looks like one has a broken ``runtime.json``.
    """
    try:
        entries = sorted(folder.glob(f"{arch}-onnxruntime-*"))
    except OSError:
        return []
    found = []
    for path in entries:
        if path.is_dir() and not path.name.startswith("."):
            doc = _read_runtime(path)
            if doc.arch == arch:
                found.append((path, doc))
    return found


def find_runtime(
    dirs: Sequence[Path], arch: str, want: RuntimeSpec, prefer: str | None
) -> tuple[Path, PreparedRuntime] | None:
    """The prepared runtime a class of ``arch`` uses: onnxruntime of the class's package and
    version pattern, the version ``prefer`` (this host's) if prepared, else the highest.

    Raises:
        SysrootError: a folder that looks like one has a broken ``runtime.json``.
    """
    if want.package != "onnxruntime":
        return None
    found = [
        (path, doc)
        for folder in dirs
        for path, doc in runtimes_in(folder, arch)
        if fnmatch.fnmatchcase(doc.onnxruntime, want.version)
    ]
    if not found:
        return None
    exact = [f for f in found if f[1].onnxruntime == prefer]
    return exact[0] if exact else max(found, key=lambda f: _version_key(f[1].onnxruntime))


def tree_digest(path: Path) -> str:
    """hex sha256 over the runtime's tree (``root``, ``site``, ``cpu``): each entry's relative
    path, kind (file with its mode's executable bit, link with its target) and content, in
    path order."""
    total = hashlib.sha256()
    for part in ("root", "site", "cpu"):
        base = path / part
        if not base.is_dir():
            total.update(f"missing {part}\n".encode())
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            here = Path(dirpath)
            for name in sorted(filenames + [d for d in dirnames if (here / d).is_symlink()]):
                entry = here / name
                rel = entry.relative_to(path).as_posix()
                if entry.is_symlink():
                    total.update(f"l {rel} {os.readlink(entry)}\n".encode())
                    continue
                with entry.open("rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
                mode = "x" if os.access(entry, os.X_OK) else "-"
                total.update(f"f{mode} {rel} {digest}\n".encode())
    return total.hexdigest()


def verify_runtime(path: Path, doc: PreparedRuntime, fix: str) -> None:
    """Check a prepared runtime's tree against the digest recorded when it was prepared.

    Raises:
        SysrootError: a piece is missing or changed; the message names it and ``fix``.
    """
    python = path / "root" / "usr" / "bin" / f"python{doc.python}"
    for needed in (python, path / "site" / "onnxruntime", path / "site" / "numpy"):
        if not needed.exists():
            raise SysrootError(
                f"the {doc.arch} runtime {path} lacks {needed.relative_to(path)}. Fix: {fix}"
            )
    found = tree_digest(path)
    if found != doc.tree_sha256:
        raise SysrootError(
            f"the {doc.arch} runtime {path} changed since it was prepared (tree sha256 "
            f"{found[:16]}..., runtime.json says {doc.tree_sha256[:16]}...). Fix: {fix}"
        )


Runner = Callable[[list[str], Path], None]
"""Runs one preparing command in a folder, raising `SysrootError` when it fails."""


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=_STEP_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise SysrootError(
            f"{cmd[0]} is not installed: preparing a runtime for another architecture uses "
            "Debian's apt-get and dpkg-deb, and pip. Fix: prepare on a Debian or Ubuntu "
            "machine and copy the folder into the emulators folder (qualify emulators show)."
        ) from None
    except subprocess.TimeoutExpired:
        raise SysrootError(f"{' '.join(cmd[:3])} ... took over {_STEP_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-1500:]
        raise SysrootError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}): {tail}")


def _apt(arch: str, state: Path, keyring: Path) -> list[str]:
    """apt-get with a private state, sources and cache: the machine's are left as they are."""
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "parts").mkdir(exist_ok=True)
    (state / "status").touch()
    debian = FOREIGN[arch][0]
    sources = state / "sources.list"
    sources.write_text(_SOURCES.format(key=keyring, suite=DEBIAN_SUITE), encoding="utf-8")
    options = {
        "APT::Architecture": debian,
        "APT::Architectures::": debian,
        "Dir::Etc::sourcelist": str(sources),
        "Dir::Etc::sourceparts": str(state / "parts"),
        "Dir::State::Lists": str(state / "lists"),
        "Dir::State::status": str(state / "status"),
        "Dir::Cache": str(state / "cache"),
        "Debug::NoLocking": "1",
    }
    return ["apt-get", "-q", *(f"-o{k}={v}" for k, v in options.items())]


def _pieces(folder: Path, source: Literal["debian", "pypi"]) -> list[PreparedPiece]:
    found = []
    for file in sorted(folder.iterdir()):
        if source == "debian":
            name, version = file.name.split("_")[:2]
            version = version.replace("%3a", ":")
        else:
            name, version = file.name.split("-")[:2]
        with file.open("rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        found.append(
            PreparedPiece(file=file.name, source=source, name=name, version=version, sha256=digest)
        )
    return found


def _unpack(work: Path, run: Runner) -> None:
    root, site = work / "root", work / "site"
    root.mkdir()
    site.mkdir()
    for deb in sorted((work / "debs").glob("*.deb")):
        run(["dpkg-deb", "-x", str(deb), str(root)], work)
    for unused in _UNUSED:
        shutil.rmtree(root / unused, ignore_errors=True)
    for wheel in sorted((work / "wheels").glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                target = (site / member.filename).resolve()
                if not target.is_relative_to(site.resolve()):
                    raise SysrootError(
                        f"{wheel.name}: member {member.filename!r} leaves the folder"
                    )
            archive.extractall(site)
    # Wheels keep no modes: onnxruntime's libraries are loaded by path, none needs +x.


def _cpu_prefixes(work: Path, arch: str) -> None:
    """One QEMU path prefix per emulated CPU of ``arch``: ``root``'s folders and its cpuinfo."""
    tops = sorted(p.name for p in (work / "root").iterdir())
    for model in CPU_MODELS.values():
        if model.arch != arch:
            continue
        prefix = work / "cpu" / model.name
        (prefix / "proc").mkdir(parents=True)
        for top in tops:
            (prefix / top).symlink_to(Path("..") / ".." / "root" / top)
        (prefix / "proc" / "cpuinfo").write_text(model.cpuinfo, encoding="ascii")


def prepare_runtime(
    arch: str,
    onnxruntime: str,
    numpy: str,
    into: Path,
    *,
    keyring: Path = DEBIAN_KEYRING,
    run: Runner = _run,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    on_event: Callable[[str], None] = lambda _m: None,
    force: bool = False,
) -> Path:
    """Download and assemble a runtime for ``arch`` into ``into`` (the only function here that
    downloads). Built in a temporary folder beside its place and renamed into it at the end, so
    a kill at any point leaves no half-made runtime (the next prepare removes the temporary).

    Args:
        arch: the architecture (a key of `FOREIGN`).
        onnxruntime: the exact onnxruntime version to pin.
        numpy: the exact numpy version to pin.
        into: the emulators folder.
        force: assemble it again even when one of that version is there and verifies.

    Returns:
        The runtime's folder.

    Raises:
        SysrootError: a tool is missing, a download or an unpacking failed, or the keyring is
            not there.
    """
    from qualify import __version__

    if arch not in FOREIGN:
        raise SysrootError(
            f"no runtime can be prepared for {arch!r}; only for {', '.join(FOREIGN)}"
        )
    if not keyring.is_file():
        raise SysrootError(
            f"{keyring} is missing: it verifies Debian's packages. Fix: apt-get install "
            "debian-archive-keyring"
        )
    name = _name(arch, onnxruntime)
    if not force and _usable(into / name, numpy):
        on_event(f"{into / name} is prepared and verifies; nothing downloaded (--force redoes it)")
        return into / name
    into.mkdir(parents=True, exist_ok=True)
    remove_leftovers(into)
    work = Path(tempfile.mkdtemp(prefix=temp_prefix(name), suffix=".tmp", dir=into))
    try:
        pieces = _download_and_unpack(arch, onnxruntime, numpy, work, keyring, run, on_event)
        doc = PreparedRuntime(
            format="qualify-emulator-runtime/1",
            arch=arch,
            python=PYTHON,
            onnxruntime=onnxruntime,
            numpy=numpy,
            debian_suite=DEBIAN_SUITE,
            pieces=pieces,
            tree_sha256=tree_digest(work),
            prepared_at=now().strftime("%Y-%m-%dT%H:%M:%SZ"),
            qualify_version=__version__,
        )
        write_atomic(work / "runtime.json", doc.model_dump_json(indent=2) + "\n")
        target = into / name
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _download_and_unpack(
    arch: str,
    onnxruntime: str,
    numpy: str,
    work: Path,
    keyring: Path,
    run: Runner,
    on_event: Callable[[str], None],
) -> list[PreparedPiece]:
    """Debian's packages and PyPI's wheels downloaded into ``work``, unpacked there, and the
    download folders removed; the pieces, each with its digest."""
    for folder in ("debs", "wheels", "apt"):
        (work / folder).mkdir()
    apt = _apt(arch, work / "apt", keyring)
    on_event(f"Debian {DEBIAN_SUITE} {FOREIGN[arch][0]} package lists (apt-get update)")
    run([*apt, "update"], work)
    on_event(f"Debian packages: {', '.join(DEBIAN_PACKAGES)}")
    run([*apt, "download", *DEBIAN_PACKAGES], work / "debs")
    on_event(f"PyPI wheels: onnxruntime {onnxruntime}, numpy {numpy} ({FOREIGN[arch][1]})")
    run(_pip(arch, onnxruntime, numpy, work / "wheels"), work)
    pieces = _pieces(work / "debs", "debian") + _pieces(work / "wheels", "pypi")
    on_event("unpacking")
    _unpack(work, run)
    _cpu_prefixes(work, arch)
    for folder in ("debs", "wheels", "apt"):
        shutil.rmtree(work / folder)
    return pieces


def _usable(path: Path, numpy: str) -> bool:
    """Whether a runtime is already prepared at ``path`` with this numpy, and verifies."""
    if not (path / "runtime.json").is_file():
        return False
    try:
        doc = _read_runtime(path)
        verify_runtime(path, doc, "")
    except SysrootError:
        return False
    return doc.numpy == numpy


def _pip(arch: str, onnxruntime: str, numpy: str, into: Path) -> list[str]:
    tag = PYTHON.replace(".", "")
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        f"--platform={FOREIGN[arch][1]}",
        f"--python-version={PYTHON}",
        "--implementation=cp",
        f"--abi=cp{tag}",
        f"--dest={into}",
        f"onnxruntime=={onnxruntime}",
        f"numpy=={numpy}",
    ]
