"""Version numbers of the contract; each bumps independently."""

#: Version of the stored/streamed event envelope and payload shapes. Bump when a stored event
#: would no longer validate; register an upcaster (see ``protocol.upcast``) for the old version.
SCHEMA_VERSION = 1

#: Version of the app-facing contract (sessions, tasks, events, tools), announced in session.created.
CONTRACT_VERSION = "1.0"

#: Version of the supervisor <-> worker JSON-RPC protocol, negotiated in runtime.initialize.
#: Major must match; a worker accepts any minor it knows of the same major.
PROTOCOL_VERSION = "1.0"
