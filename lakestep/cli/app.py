"""The ``lakestep`` command group, and how it turns errors into one line."""

from __future__ import annotations

import sys
from typing import Sequence

import click
import sqlalchemy as sa

from .._version import __version__
from ..errors import LakestepError
from ..secrets import mask_url
from . import barriers, doctor, maintain, query, report, serve, services, tables


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="lakestep")
def cli() -> None:
    """lakestep: look at a catalog and its pipeline, and keep it in shape.

    Every command takes --catalog URL (or $LAKESTEP_CATALOG) and --json.

    \b
    Examples:
      export LAKESTEP_CATALOG=postgresql://lake@db/lake
      lakestep tables
      lakestep barriers --last 8
      lakestep doctor
      lakestep query "SELECT * FROM shop.daily JOIN shop.vip USING (k)"
      lakestep report --html pipeline.html
    """


for module in (tables, barriers, query, maintain, services, serve, doctor, report):
    for command in module.COMMANDS:
        cli.add_command(command)


def _invoke(argv: Sequence[str] | None) -> int:
    try:
        code = cli.main(args=list(argv) if argv is not None else None, prog_name="lakestep", standalone_mode=False)
    except click.exceptions.Exit as e:  # --help, --version
        return int(e.exit_code)
    except click.ClickException as e:  # usage errors: click's message, exit code 2
        e.show()
        return e.exit_code
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except LakestepError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 1
    except sa.exc.OperationalError as e:  # the database went away mid-command
        print(f"error: catalog database: {one_line(str(e.orig or e))}", file=sys.stderr)
        return 1
    return int(code or 0) if isinstance(code, int) else 0


def one_line(message: str) -> str:
    """An error message on one line, masked; without SQLAlchemy's background link."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and not ln.strip().startswith("(Background on")]
    return mask_url(" ".join(lines))


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line; a :class:`LakestepError` prints one line on stderr and returns 1,
    Ctrl-C returns 130."""
    try:
        return _invoke(argv)
    except LakestepError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
