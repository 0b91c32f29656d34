"""Job chains: a DAG of jobs run by the coordinator's traverser (spincycle's semantics).

builder.py builds (Python or JSON), validate.py checks the DAG, client/chains.py stores and
reads chains for the App, coordinator/traverser.py runs them, context.py is a handler's view
of its chain, growth.py the jobs a running one adds (ctx.chain.add); checks.py checks a job
against the job-type registry for both.
Imports here stay light: the store package imports store.chains, never this package.

Layer: beside coordinator/, under client/ and worker/; may import jobtypes, flow, store,
broker and the bottom modules (records, errors, config), never client or worker.
"""

from hivejobs.chains.builder import Chain, ChainJob
from hivejobs.chains.context import ChainInfo
from hivejobs.chains.growth import Growth

__all__ = ["Chain", "ChainInfo", "ChainJob", "Growth"]
