-- hivejobs schema 19: chains that grow while they run (ctx.chain.add).
-- Never edited once shipped: a schema change is a new file.

-- The key of the chain job whose handler added this job (NULL: declared at run_chain). An
-- added job's key is '<added_by>.<name>', so a try that adds again after a kill finds the
-- jobs its earlier try added under the same keys and adds only the others.
ALTER TABLE hivejobs_chain_job ADD COLUMN added_by text;
