"""The operator's tools: reading and replaying dead letters (`letters`: pure selection, summaries
and replay plans; `kafka`: group-less reading and the rate-limited replay), and looking up one
conversation (`conversation`). `commands` runs them for `switchboard deadletters` and
`switchboard conversation`."""
