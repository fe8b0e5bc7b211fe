"""What a user's own tests can import: in-process training loops without Redis
(:mod:`.local_loop` on-policy, :mod:`.offpolicy_loop` off-policy) and a fakeredis client whose
scripts have ``redis.sha1hex`` (:mod:`.fakes`). Nothing in the core imports this package."""
