"""`residents init`: a starter configuration folder, from the examples that ship with the package."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from .. import bundled
from .common import in_config


@click.command()
@click.argument("directory", metavar="DIR", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite starter files already in DIR (other files are left alone).")
def init(directory: Path | None, force: bool) -> int:
    """Write starter residences/, policies/ and .env.example into DIR.

    DIR (default: the configuration folder) is created if missing. The residences and policies are
    the examples that ship with residents; .env.example names every variable they read, with no
    values. A file already there is never overwritten without --force: nothing is written then.

    \b
    Example:
      residents init mybots && residents --config mybots check
    """
    dest = directory if directory is not None else Path(in_config("."))
    written = bundled.write_starter(dest, force=force)
    for rel in written:
        print(dest / rel)
    shown = "" if dest.resolve() == Path.cwd().resolve() else f" --config {shlex.quote(str(dest))}"
    env, example = dest / ".env", dest / bundled.ENV_EXAMPLE
    print(f"next: copy {example} to {env} and fill in its values (never commit .env).")
    print(f"then: edit the residences, and run `residents{shown} check` and `residents{shown} run`.")
    return 0
