"""Experience path: agent steps -> chunks -> insert.lua -> shard inboxes -> move.lua -> shard
streams -> receiver -> replay,
and the retention/gc that keeps the streams bounded."""
