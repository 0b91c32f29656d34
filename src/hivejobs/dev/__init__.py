"""`hivejobs dev`: the command (``command``) and the embedded servers it starts (``embedded``).

Nothing is imported here: `hivejobs.dev.embedded.process` is loaded by the supervisor too.
"""
