"""What ships with the package: the example residences and policies, and the replay scenarios.

One copy of each lives at the top of the repository (`residences/`, `policies/`, `scenarios/`),
where people read and edit them. A built wheel carries the same folders as `residents/examples/`
(setup.py copies them at build time), so an installed `residents` finds them wherever it runs; an
editable install or a source checkout reads the repository's folders. Nothing else is read from
where the package lives: configuration and ledgers come from the configuration folder.
"""

from __future__ import annotations

from pathlib import Path

import yaml

_HERE = Path(__file__).resolve().parent
PACKAGED = _HERE / "examples"  # in an installed wheel
CHECKOUT = _HERE.parent  # a source checkout (an editable install runs from one)

STARTER_FOLDERS = ("residences", "policies")
ENV_EXAMPLE = ".env.example"


class BundleError(Exception):
    """The bundled examples cannot be found or written where asked; one line saying which."""


class StarterExists(BundleError):
    """`init` would overwrite files a person may have edited; nothing was written."""

    def __init__(self, dest: Path, existing: tuple[str, ...]) -> None:
        self.dest, self.existing = dest, existing
        shown = ", ".join(existing[:6]) + (", …" if len(existing) > 6 else "")
        super().__init__(f"{dest}: already has {shown}; nothing written (--force overwrites them)")


def root() -> Path:
    """The folder holding the bundled residences/, policies/ and scenarios/."""
    if (PACKAGED / "scenarios").is_dir():
        return PACKAGED
    if (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "scenarios").is_dir():
        return CHECKOUT
    raise BundleError(f"the bundled examples are missing from this installation ({PACKAGED}); reinstall residents")


def scenario_names() -> list[str]:
    """The bundled scenarios, by the name `residents replay NAME` takes."""
    return sorted(p.stem for p in (root() / "scenarios").glob("*.yaml"))


def scenario(name: str) -> Path | None:
    """The bundled scenario called `name` (`ceiling` or `ceiling.yaml`), or None; never a path."""
    stem = name.removesuffix(".yaml")
    if not stem or "/" in stem or "\\" in stem or stem.startswith("."):
        return None
    path = root() / "scenarios" / f"{stem}.yaml"
    return path if path.is_file() else None


def starter_files() -> dict[str, bytes]:
    """What `residents init` writes, by path relative to the destination: the examples as they are,
    and an `.env.example` naming every variable they read (never a value)."""
    base = root()
    files = {
        f"{folder}/{p.name}": p.read_bytes()
        for folder in STARTER_FOLDERS
        for p in sorted((base / folder).glob("*.yaml"))
    }
    files[ENV_EXAMPLE] = env_example(files).encode("utf-8")
    return files


def env_example(files: dict[str, bytes]) -> str:
    """The environment the starter residences need, read from their own `discord.token_env`, so it
    cannot drift from them."""
    tokens: list[tuple[str, str]] = []
    for rel, raw in files.items():
        if not rel.startswith("residences/"):
            continue
        data = yaml.safe_load(raw)
        discord = data.get("discord") if isinstance(data, dict) else None
        if isinstance(discord, dict) and isinstance(discord.get("token_env"), str):
            tokens.append((discord["token_env"], rel))
    lines = [
        "# The environment `residents run` reads. Tokens and keys never go in YAML.",
        "# residents does not read this file itself: copy it to .env, fill in the values, and load it",
        "# into the shell (set -a; . ./.env; set +a) or your process manager. Never commit the filled copy.",
        "",
        "# The provider: an Anthropic API key; ANTHROPIC_BASE_URL points at any Anthropic-compatible server.",
        "ANTHROPIC_API_KEY=",
        "# ANTHROPIC_BASE_URL=",
        "",
        "# One Discord bot token per residence, in the variable its discord.token_env names.",
    ]
    for var, rel in tokens:
        lines += [f"# {rel}", f"{var}="]
    return "\n".join(lines) + "\n"


def write_starter(dest: Path, force: bool = False) -> list[str]:
    """Write the starter files into `dest` (created if missing); the paths written, relative to it.

    Files already there are never overwritten unless `force`: then none is written at all."""
    files = starter_files()
    if dest.exists() and not dest.is_dir():
        raise BundleError(f"{dest}: not a folder")
    existing = tuple(rel for rel in files if (dest / rel).exists())
    if existing and not force:
        raise StarterExists(dest, existing)
    try:
        for rel, raw in files.items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(raw)
    except OSError as e:
        raise BundleError(f"{dest}: cannot write the starter files ({e.strerror or e})") from None
    return list(files)
