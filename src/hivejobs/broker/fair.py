"""Fair dispatch across keys (`fair_by=`): per-key lists and a ring of active keys in Redis.

Keys (under the prefix, in the type's hash tag, so a Lua script may touch them all):
  ``{prefix}{<type>}:p<priority>``       the ordinary lists (broker/__init__.py), the *inbox*:
                                        every push site keeps pushing there, unchanged.
  ``{prefix}{<type>}:fk:<priority>:<key>`` list of ids of one key at one priority; RPUSH by the
                                        sorter, popped from the left by the ring pop.
  ``{prefix}{<type>}:fring``            sorted set of the keys with ids, scored by turn: the
                                        lowest score is served next, then moved to the back.
  ``{prefix}{<type>}:fcredit``          hash key -> turns left for the key at the ring's head
                                        (weighted round-robin: a key of weight w takes w ids).
  ``{prefix}{<type>}:fprio``            set of the priorities (digits) whose per-key lists may
                                        exist: a pop reads only those lists.
  ``{prefix}{<type>}:fwake``            list of tokens pushed by every placement (at most 16
                                        kept): a pool waiting on an empty inbox and ring
                                        waits on it too, so ids placed straight into the
                                        per-key lists (enqueue_many) wake it.
  ``{prefix}{<type>}:fsort``            string, the sorter's lock (a token, expires): one
                                        process sorts the inbox at a time, so a key's ids keep
                                        the inbox's order.

The pool of a fair type sorts before it pops: it moves a batch of ids from the inbox, asks
Postgres (the truth: `keys_of`) each live id's key and priority, and distributes them to the
per-key lists in one script; then it pops round-robin across keys in another. Both scripts are
atomic, so a key is in the ring whenever it has ids (a key whose lists emptied is dropped on
its next turn). Everything here may be lost: ids popped by a process that dies, a ring or
list evicted or flushed. The reconciler finds the ids no list holds, reading the lists of
the keys of the type's oldest queued rows (`key_heads`), and pushes them to the inbox again; a
key list without a ring entry (ring lost) is seen as lost too, and its ids' new copies put the
key back in the ring. Never decides who may run: the claim does.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import redis

from hivejobs.broker import Broker, Popped, clean_id
from hivejobs.errors import InvalidJobType, PayloadInvalid
from hivejobs.serialization import decode_json

SORT_BATCH = 1000  # ids moved from the inbox per round (one Postgres lookup each)
SORT_ROUNDS = 10  # rounds per sort, so that one pop never waits on a huge inbox for long
SORT_LOCK_MS = 2000  # a sorter that dies holds the inbox this long at most
MAX_KEY_CHARS = 200  # a key's JSON text, at enqueue (it becomes part of a Redis key name)

# KEYS: ring, priorities, wake list. ARGV: key-list prefix, then (priority, key, id) triples
# in inbox order. A key not in the ring joins at its back; each priority used is noted, so
# that a pop looks only at the lists that can exist; a token on the wake list (at most
# WAKE_TOKENS kept) ends the wait of a pool blocked on an empty inbox and ring.
_DISTRIBUTE = """
local ring, prios, wake = KEYS[1], KEYS[2], KEYS[3]
local prefix = ARGV[1]
local top = redis.call('ZRANGE', ring, -1, -1, 'WITHSCORES')
local turn = 0
if #top > 0 then turn = tonumber(top[2]) end
local seen = {}
for i = 2, #ARGV, 3 do
  local key = ARGV[i + 1]
  redis.call('RPUSH', prefix .. ARGV[i] .. ':' .. key, ARGV[i + 2])
  if not seen[ARGV[i]] then
    seen[ARGV[i]] = true
    redis.call('SADD', prios, ARGV[i])
  end
  if not redis.call('ZSCORE', ring, key) then
    turn = turn + 1
    redis.call('ZADD', ring, turn, key)
  end
end
redis.call('RPUSH', wake, 1)
redis.call('LTRIM', wake, -16, -1)
return turn
"""

# KEYS: ring, credit, priorities, then the inbox's lists. ARGV: key-list prefix, how many
# ids, then (key, weight) pairs. Returns 1 if the inbox holds ids (0 if not), then (priority,
# id) pairs: the pool sorts only when there is something to sort, so a pop is one round trip.
# Each pass takes as many keys off the ring's head as ids are still wanted (ZPOPMIN); each key
# in turn gives up to its weight (or what its credit left), highest priority first, and goes
# to the back (a new highest score); a key whose lists ran dry leaves the ring; a key whose
# turn the full pop cut short, and the keys not reached, go back with their own scores (the
# credit left is kept). A key alone in the ring gives the whole pop. The credit hash is read
# only for a weighted type or a credit left over. Every pass pops an id or empties the ring.
_POP = """
local ring, credit, prios = KEYS[1], KEYS[2], KEYS[3]
local prefix = ARGV[1]
local want = tonumber(ARGV[2])
local weights = {}
local credits = redis.call('EXISTS', credit) == 1
for i = 3, #ARGV, 2 do
  weights[ARGV[i]] = tonumber(ARGV[i + 1])
  credits = true
end
local out = {0}
if redis.call('EXISTS', unpack(KEYS, 4)) > 0 then out[1] = 1 end
local used = redis.call('SMEMBERS', prios)
table.sort(used)
local top = redis.call('ZRANGE', ring, -1, -1, 'WITHSCORES')
local turn = 0
if #top > 0 then turn = tonumber(top[2]) end
local taken = 0
while taken < want do
  local heads = redis.call('ZPOPMIN', ring, want - taken)
  if #heads == 0 then break end
  local alone = #heads == 2 and redis.call('ZCARD', ring) == 0
  local back = {}
  for i = 1, #heads, 2 do
    local key, score = heads[i], heads[i + 1]
    if taken >= want then
      back[#back + 1] = score
      back[#back + 1] = key
    else
      local left = 1
      if credits then left = tonumber(redis.call('HGET', credit, key)) or weights[key] or 1 end
      if alone then left = want - taken end
      local n = math.min(left, want - taken)
      local got = 0
      for _, p in ipairs(used) do
        local ids = redis.call('LPOP', prefix .. p .. ':' .. key, n - got)
        if ids then
          for _, id in ipairs(ids) do
            out[#out + 1] = p
            out[#out + 1] = id
          end
          got = got + #ids
          if got >= n then break end
        end
      end
      taken = taken + got
      if got < n then
        if credits then redis.call('HDEL', credit, key) end
      elseif left - got > 0 and not alone then
        back[#back + 1] = score
        back[#back + 1] = key
        redis.call('HSET', credit, key, left - got)
      else
        turn = turn + 1
        back[#back + 1] = turn
        back[#back + 1] = key
        if credits then redis.call('HDEL', credit, key) end
      end
    end
  end
  if #back > 0 then redis.call('ZADD', ring, unpack(back)) end
end
return out
"""

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

MAX_WEIGHT = 1000
MAX_WEIGHTS = 1000  # weighted keys per type: every pop hands the weights to the script


@dataclass(frozen=True)
class FairBy:
    """A type's `fair_by` field and `fair_weights` (key -> ids per turn; others take 1)."""

    field: str
    weights: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def check_payload(self, name: str, value: object) -> None:
        """At enqueue, before any write: the payload holds the field, as a string or an
        integer short enough to name a list (a missing field would file every such job
        under one key no one asked for)."""
        if not isinstance(value, dict):
            raise PayloadInvalid(name, f"fair_by={self.field!r} needs a JSON object payload")
        if self.field not in value:
            raise PayloadInvalid(name, f"the payload has no {self.field!r} field (fair_by)")
        key = value[self.field]
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise PayloadInvalid(
                name,
                f"the payload's {self.field!r} field (fair_by) must be a string or an integer,"
                f" not {type(key).__name__}",
            )
        if len(str(key)) > MAX_KEY_CHARS:
            raise PayloadInvalid(
                name,
                f"the payload's {self.field!r} field (fair_by) is longer than "
                f"{MAX_KEY_CHARS} characters",
            )

    def key_of(self, payload: bytes) -> str:
        """A stored payload's key, as fair.sql reads it (->>: a string as is, an integer
        in decimal; missing or null: '')."""
        value = decode_json(payload)
        key = value.get(self.field) if isinstance(value, dict) else None
        return "" if key is None else str(key)


def checked_fair(fair_by: object, weights: object) -> FairBy | None:
    """`@app.job(fair_by=..., fair_weights=...)`, or a clear InvalidJobType."""
    if fair_by is None:
        if weights is not None:
            raise InvalidJobType("fair_weights needs fair_by (the payload field of the key)")
        return None
    if not isinstance(fair_by, str) or not fair_by:
        raise InvalidJobType(f"fair_by must be the name of a payload field, not {fair_by!r}")
    if weights is None:
        return FairBy(fair_by)
    if not isinstance(weights, Mapping) or len(weights) > MAX_WEIGHTS:
        raise InvalidJobType(
            f"fair_weights must be a dict of at most {MAX_WEIGHTS} keys -> whole numbers"
        )
    checked: dict[str, int] = {}
    for key, weight in weights.items():
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise InvalidJobType(f"fair_weights keys must be strings or integers, not {key!r}")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise InvalidJobType(
                f"fair_weights[{key!r}] must be a whole number from 1 to {MAX_WEIGHT}, "
                f"not {weight!r}"
            )
        checked[str(key)] = weight
    return FairBy(fair_by, checked)


# (job id, priority, key) of the live ids of a batch; ids no longer queued are left out.
KeysOf = Callable[[list[str]], list[tuple[str, int, str]]]


def ring_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:fring"


def credit_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:fcredit"


def list_prefix(prefix: str, name: str) -> str:
    """Prefix of the per-key lists: + '<priority>:<key>'."""
    return f"{prefix}{{{name}}}:fk:"


def priorities_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:fprio"


def wake_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:fwake"


def sort_lock_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:fsort"


class FairQueue:
    """One fair type's side of the broker in a pool process: sort the inbox, pop across keys.

    Owns nothing but the registered scripts and the type's weights (read-only); every state
    lives in Redis, changed only by the scripts above, so racing pools see one ring."""

    def __init__(self, broker: Broker, name: str, weights: Mapping[str, int]) -> None:
        self.broker = broker
        self.name = name
        prefix = broker.prefix
        self.ring = ring_key(prefix, name)
        self.credit = credit_key(prefix, name)
        self.prios = priorities_key(prefix, name)
        self.lists = list_prefix(prefix, name)
        self.lock = sort_lock_key(prefix, name)
        self.inbox = broker.queue_keys(name)
        self.wake = wake_key(prefix, name)
        self._weights = [str(x) for kv in sorted(weights.items()) for x in kv]
        self._pop = broker.redis.register_script(_POP)
        self._unlock = broker.redis.register_script(_UNLOCK)

    def pop(self, count: int, keys_of: KeysOf) -> Popped:
        """Up to `count` ids, round-robin across keys; blocks up to the broker's block time
        when there is nothing to pop anywhere (on the inbox, as an ordinary pool does)."""
        popped, inbox = self._ring_pop(count)
        # Sorted after the pop: ids new to the ring get their turns from the next pop on
        # (or from this one's rest, if the ring ran short).
        if inbox and self.sort(keys_of) and len(popped.ids) < count:
            more, _ = self._ring_pop(count - len(popped.ids))
            popped = Popped(popped.key if popped.ids else more.key, popped.ids + more.ids)
        if popped.ids:
            return popped
        # Nothing anywhere: wait for ids in the inbox, or for the wake list that a placement
        # straight into the ring (enqueue_many) pushes to.
        waited = [*self.inbox, self.wake]
        reply = self.broker.redis.blmpop(
            self.broker.block_s, len(waited), *waited, direction="LEFT", count=count
        )
        if reply and reply[0] != self.wake.encode():
            self._place(_ids(reply[1]), keys_of)  # type: ignore[arg-type]
        return self._ring_pop(count)[0]

    def sort(self, keys_of: KeysOf) -> int:
        """Move the inbox's ids to their keys' lists, under the sort lock (another process
        sorting now: skip, it does the work). Returns the ids moved."""
        token = str(uuid.uuid4())
        if not self.broker.redis.set(self.lock, token, nx=True, px=SORT_LOCK_MS):
            return 0
        moved = 0
        try:
            for _ in range(SORT_ROUNDS):
                reply = self.broker.redis.lmpop(
                    len(self.inbox), *self.inbox, direction="LEFT", count=SORT_BATCH
                )
                if not reply:
                    break
                # One list per round (LMPOP takes from the first non-empty one): a short
                # batch does not mean the inbox is empty, only that list. Stopping there
                # left a lower priority's ids unsorted for as long as refused ids kept
                # coming back to a higher one.
                moved += self._place(_ids(reply[1]), keys_of)  # type: ignore[arg-type]
        finally:
            self._unlock(keys=[self.lock], args=[token])
        return moved

    def _place(self, ids: list[str], keys_of: KeysOf) -> int:
        """Distribute popped ids to their keys' lists. If this fails (Postgres or Redis
        down), the ids are out of every list: the reconciler pushes them again."""
        rows = keys_of(ids) if ids else []
        if not rows:
            return 0
        place(self.broker, self.name, rows)
        return len(rows)

    def _ring_pop(self, count: int) -> tuple[Popped, bool]:
        """Up to `count` ids from the ring, and whether the inbox holds ids to sort."""
        reply = self._pop(
            keys=[self.ring, self.credit, self.prios, *self.inbox],
            args=[self.lists, count, *self._weights],
        )
        ids = [c for raw in reply[2::2] if (c := clean_id(raw)) is not None]
        # Ids refused by the claim (a pause, a limit) go back through the inbox: their key
        # and priority are read again there. The highest priority popped names the list.
        first = int(reply[1]) if len(reply) > 1 else 0
        return Popped(self.broker.queue_key(self.name, first), ids), bool(reply[0])


def place(broker: Broker, name: str, rows: list[tuple[str, int, str]]) -> None:
    """(id, priority, key) rows to the end of their keys' lists, in order, the new keys to the
    back of the ring: one script. An enqueuer that holds the payloads places its jobs here
    itself, so that no pool has to read their keys back from Postgres."""
    args: list[str | int] = [list_prefix(broker.prefix, name)]
    for job_id, priority, key in rows:
        args += [priority, key, job_id]
    for start in range(0, len(args) - 1, 3 * SORT_BATCH):  # bounded script arguments
        broker.redis.register_script(_DISTRIBUTE)(
            keys=[
                ring_key(broker.prefix, name),
                priorities_key(broker.prefix, name),
                wake_key(broker.prefix, name),
            ],
            args=[args[0], *args[1 + start : 1 + start + 3 * SORT_BATCH]],
        )


def key_heads(
    broker: Broker, name: str, priority: int, keys: Iterable[str], count: int
) -> dict[str, list[str]]:
    """The first `count` ids of these keys' lists at one priority (the reconciler's look at
    the keys of the oldest queued rows: one pipeline, whatever the number of keys in the
    ring). Only lists a pop can reach answer (the key in the ring, the priority noted): a list
    no pop reaches holds nothing that counts; its ids are pushed again, and their new copies
    make it reachable. A key left out of the answer holds nothing reachable (an empty list, a
    list off the ring, a key Redis refuses)."""
    keys = list(keys)
    lists = list_prefix(broker.prefix, name)
    ring = ring_key(broker.prefix, name)
    with broker.redis.pipeline(transaction=False) as pipe:
        pipe.sismember(priorities_key(broker.prefix, name), str(priority))
        for key in keys:
            pipe.zscore(ring, key)
            pipe.lrange(f"{lists}{priority}:{key}", 0, count - 1)
        replies = pipe.execute(raise_on_error=False)
    noted = replies[0]
    if isinstance(noted, Exception) or not noted:
        return {}
    heads: dict[str, list[str]] = {}
    for i, key in enumerate(keys):
        score, ids = replies[1 + 2 * i], replies[2 + 2 * i]
        if isinstance(score, Exception) or score is None:
            continue
        if not isinstance(ids, Exception) and ids:
            heads[key] = _ids(ids)
    return heads


def active_keys(broker: Broker, name: str) -> int:
    """Keys with ids in Redis now (the ring's size): a per-type gauge, never per key."""
    try:
        return int(broker.redis.zcard(ring_key(broker.prefix, name)))
    except redis.RedisError:
        return 0


def _ids(raw: list[bytes]) -> list[str]:
    return [c for r in raw if (c := clean_id(r)) is not None]
