"""`hivejobs` on the command line: argparse to App calls, errors to exit codes.

  entry.py      `main` (the console script): parse, run, errors to one line and an exit code
  parser.py     the parser: every command, option and help text, bound to its function
  shared.py     the exit codes, the App a command opens, time arguments, JSON and tables
  jobs.py       enqueue, status, jobs, cancel, replay
  fleet.py      workers, cron, pause, resume, scale, keys, restart
  chains.py     chain run | status | log | stop | list | ps, batch status
  processes.py  migrate, run, serve, dev, bench
  views.py      terminal tables and trees of what the App returns

The top layer: may import any package of hivejobs; nothing imports it.
"""

from hivejobs.cli.entry import main as main
