-- The coordinator lease (store/leases.py).
-- Rule numbers (R1..R12) are those of docs/concepts/reliability.md.

-- name: lease_acquire
-- Take the lease when free or expired, renew it when ours; the term grows on every change of
-- holder, and every coordinator write checks it (R7).
INSERT INTO hivejobs_leader (name, holder, term, acquired_at, expires_at)
VALUES ('coordinator', %(holder)s, 1, now(), now() + %(ttl_s)s * interval '1 second')
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder,
       term = CASE WHEN hivejobs_leader.holder = EXCLUDED.holder THEN hivejobs_leader.term
                   ELSE hivejobs_leader.term + 1 END,
       acquired_at = CASE WHEN hivejobs_leader.holder = EXCLUDED.holder
                          THEN hivejobs_leader.acquired_at ELSE now() END,
       expires_at = EXCLUDED.expires_at
 WHERE hivejobs_leader.holder = EXCLUDED.holder
    OR hivejobs_leader.holder IS NULL
    OR hivejobs_leader.expires_at < now()
RETURNING term;

-- name: lease_resign
UPDATE hivejobs_leader SET holder = NULL, expires_at = now()
 WHERE name = 'coordinator' AND holder = %(holder)s;

-- name: lease_read
SELECT holder::text, term, expires_at > now() AS valid FROM hivejobs_leader
 WHERE name = 'coordinator';

-- name: lease_hold
-- First statement of every coordinator transaction: FOR SHARE makes a takeover wait until this
-- transaction ends, so no write of an old term lands after a new term began (I7).
SELECT term FROM hivejobs_leader
 WHERE name = 'coordinator' AND holder = %(holder)s AND term = %(term)s AND expires_at > now()
   FOR SHARE;
