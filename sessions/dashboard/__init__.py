"""The operator's dashboard: server-rendered pages and the fragments that keep
them live. Every page and its live updates render the same template fragment
(tree: sessions/_tree.html; transcript: sessions/_event_rows.html), and every
action goes through sessions.commands with an Idempotency-Key, like the API."""
