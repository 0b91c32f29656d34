"""`hivejobs` on the command line: argparse to App calls, errors to exit codes.

  commands.py  the parser, every subcommand, the exit codes; `main` (the console script)
  views.py     terminal tables and trees of what the App returns

The top layer: may import any package of hivejobs; nothing imports it.
"""

from hivejobs.cli.commands import main as main
