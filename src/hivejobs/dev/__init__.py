"""`hivejobs dev`: one command that starts the embedded servers (hivejobs.embedded) and a
worker against them, for a newcomer with only Python.

The top layer: may import anything below; nothing in the runtime imports it (the embedded
servers it starts live in hivejobs.embedded, which the backend choice uses too).
"""
