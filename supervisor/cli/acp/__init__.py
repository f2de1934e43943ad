"""``codesdk acp``: CodeSDK served as an Agent Client Protocol agent on stdio (``translate``: the mapping, pure;
``server``: the connection; ``command``: the command line's side, an embedded supervisor or ``--url``)."""
