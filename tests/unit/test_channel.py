"""Subscription: a message published after open() returns is heard; paused, nothing is; drained
messages are old news."""

from surreal_redis.hub.channel import Subscription


def test_open_hears_what_follows_and_pause_hears_nothing(fake_redis):
    sub = Subscription(fake_redis, "ch")
    assert not sub.is_open
    sub.open()
    assert sub.is_open and sub.next(0.01) is None
    fake_redis.publish("ch", "1")
    fake_redis.publish("other", "x")
    fake_redis.publish("ch", 2)
    assert sub.next(1.0) == b"1" and sub.drain() == [b"2"] and sub.next(0.01) is None
    sub.pause()
    assert not sub.is_open
    fake_redis.publish("ch", "while paused")
    sub.open()  # the same connection again: the pause's tail is skipped
    fake_redis.publish("ch", "3")
    assert sub.drain() == [b"3"]
    sub.close()
    sub.close()  # twice is harmless
    assert sub.drain() == []  # subscribes again on a new connection
    fake_redis.publish("ch", "4")
    assert sub.next(1.0) == b"4"
    sub.close()
