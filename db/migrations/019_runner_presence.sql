-- Runner presence. Every node's presence sweep looks for runners recorded connected that no
-- heartbeat reached within the presence timeout (their node died with the connection): this
-- index holds only the connected rows, by when each was last heard from.
CREATE INDEX runners_connected_seen ON runners (last_seen_at) WHERE connected;
