"""The verbs people type: `residents replay | check | ledger | usage | run | status | room | demo | init`, on click.

Every verb is imported here by name. Library code raises its own errors; only `main` turns them
into exit statuses: 2 and one line on stderr for bad input, 1 for a ledger that cannot be used or
an internal error, 130 for an interrupt. A traceback is shown only with --debug.
"""

from __future__ import annotations

import gc
import logging
import sys
from pathlib import Path

import click

from ..bundled import BundleError
from ..config import ConfigError
from ..ledger import LedgerError, LedgerInUse
from .check import check
from .common import DEFAULT_DB, Options, UsageError
from .demo import demo
from .init import init
from .ledger import ledger
from .replay import replay
from .room import room
from .run import run
from .status import status
from .usage import usage

__all__ = ["DEFAULT_DB", "UsageError", "cli", "main"]

log = logging.getLogger(__name__)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    package_name="residents", prog_name="residents", message="%(prog)s %(version)s", help="Print the version and exit."
)
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-v: info, -vv: debug).")
@click.option("--debug", is_flag=True, help="Show tracebacks of internal errors.")
@click.option(
    "--config",
    "config",
    metavar="DIR",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The configuration folder (default: the current folder): residences/, policies/, "
    "residents.yaml and the default ledger data/ledger.db are read from here.",
)
@click.pass_context
def cli(ctx: click.Context, verbose: int, debug: bool, config: Path | None) -> None:
    """AI residents in Discord rooms that tell the truth about every output.

    \b
    Example:
      residents replay ceiling
      residents init mybots && residents --config mybots check
    """
    opts = ctx.ensure_object(Options)
    opts.debug, opts.config = debug, config
    logging.basicConfig(
        level=logging.WARNING - 10 * verbose,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Everything imported so far lives as long as the process: keep it out of the collector's
    # full passes, which otherwise pause streams for ~100 ms (bench/README.md).
    gc.freeze()


for _verb in (replay, check, ledger, usage, run, status, room, demo, init):
    cli.add_command(_verb)


def main(argv: list[str] | None = None) -> int:
    """Run one command line; the exit status, never an exception (unless --debug asks for it)."""
    opts = Options()
    try:
        result = cli.main(args=argv, prog_name="residents", standalone_mode=False, obj=opts)
        return int(result or 0)
    except click.ClickException as e:  # bad arguments: click's usage line and message, on stderr
        e.show()
        return e.exit_code
    except click.Abort:  # click's form of KeyboardInterrupt
        return 130
    except ConfigError as e:  # the first problem; `check` prints every one
        more = len(e.problems) - 1
        print(
            str(e)
            + (
                f" (and {more} more problem{'s' if more > 1 else ''} in this configuration: "
                "`residents check` lists them all)"
                if more
                else ""
            ),
            file=sys.stderr,
        )
        return 2
    except (UsageError, BundleError) as e:
        print(f"residents: {e}", file=sys.stderr)
        return 2
    except LedgerInUse as e:  # a second writer: refused at start, as a usage error is
        print(f"residents: {e}", file=sys.stderr)
        return 2
    except LedgerError as e:
        print(f"residents: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last line of defence: one line, never a traceback, unless asked
        if opts.debug:
            raise
        log.debug("internal error", exc_info=True)
        print(f"residents: internal error: {type(e).__name__}: {e} (run with --debug for details)", file=sys.stderr)
        return 1
